"""python -m hybrid_sgl.launch_server [--model-path DIR] [--port 30000] ...

Loads the model (the bundled tiny one without --model-path), logs the layer plan and the memory
plan, and serves SGLang's native API and the OpenAI-compatible API until Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import signal
import socket
import sys

import uvicorn

from hybrid_sgl.server_args import ServerArgs

logger = logging.getLogger("hybrid_sgl.launch_server")

# The HTTP event loop and the engine loop share one interpreter. While the engine thread runs Python (building
# and launching steps), a thread that wants the GIL waits up to the switch interval for it, and the event loop
# wants it again after every socket call: at Python's default 5 ms, a burst of 16 light requests took 411 ms
# against 13 ms with the engine idle; at 1 ms, 120 ms (bench/http_intake.py on CPU, bench/README.md).
SWITCH_INTERVAL_S = 0.001


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """One line naming the flag, exit status 2 (the usage block is --help's)."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse_args(argv: list[str] | None = None) -> ServerArgs:
    """The command line as ServerArgs; a value that cannot serve (ServerArgs.check) exits with status 2
    before the port is bound or any weights load."""
    parser = _Parser(
        prog="python -m hybrid_sgl.launch_server",
        description="Serve a hybrid LLM with SGLang's native API (/generate) and the OpenAI-compatible "
                    "API (/v1/completions, /v1/chat/completions).")
    ServerArgs.add_cli_args(parser)
    args = ServerArgs.from_cli_args(parser.parse_args(argv))
    try:
        args.check()
    except ValueError as e:
        parser.error(str(e))
    return args


def bind_port(host: str, port: int) -> socket.socket:
    """Take the HTTP port before the model loads, so that a busy port fails in a second, not after the
    load; uvicorn serves on this socket."""
    # IPPROTO_TCP spelled out: asyncio sets TCP_NODELAY only on sockets that say so, and without it a
    # kept-alive connection waits ~40 ms for a delayed ACK on every response
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: TIME_WAIT is no obstacle
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot bind {host}:{port} ({e.strerror}): another process holds it; choose another "
                         "--port (or stop that process)") from e
    return sock


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        sock = bind_port(args.host, args.port)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from hybrid_sgl.engine import Engine
    from hybrid_sgl.server.app import create_app

    try:
        engine = Engine(**dataclasses.asdict(args))
    except (ValueError, OSError) as e:
        sock.close()
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        app = create_app(engine)
        resolved = engine.server_args
        url = f"http://{resolved.host}:{resolved.port}"
        logger.info("serving %s at %s (native API: %s/generate, OpenAI API: %s/v1)%s", resolved.served_model_name,
                    url, url, url, "; API key required" if resolved.api_key else "")
        config = uvicorn.Config(app, host=resolved.host, port=resolved.port, log_level=resolved.log_level,
                                access_log=resolved.enable_access_log, timeout_graceful_shutdown=5,
                                timeout_keep_alive=30)
        # uvicorn shuts down gracefully on SIGINT / SIGTERM, then re-raises the signal: end quietly.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with contextlib.suppress(KeyboardInterrupt):
            uvicorn.Server(config).run(sockets=[sock])
    finally:
        sock.close()
        engine.shutdown()
        logger.info("shut down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
