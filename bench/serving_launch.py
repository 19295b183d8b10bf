"""`--launch`: start `python -m hybrid_sgl.launch_server` in a subprocess, wait for /health, and
stop it (Ctrl-C, as a user would) when the benchmark is done."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: str, lines: int = 30) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


@contextlib.contextmanager
def launched_server(server_args: str, log_path: str, timeout: float):
    """Yields the server's base URL."""
    args = shlex.split(server_args)
    if "--port" not in args:
        args += ["--port", str(_free_port())]
    port = args[args.index("--port") + 1]
    host = args[args.index("--host") + 1] if "--host" in args else "127.0.0.1"
    url = f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "hybrid_sgl.launch_server", *args]
    print(f"launching: {shlex.join(cmd)} (log: {log_path})", flush=True)
    with open(log_path, "w") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_healthy(url, process, log_path, timeout)
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_healthy(url: str, process: subprocess.Popen, log_path: str, timeout: float) -> None:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode} during start-up:\n{_tail(log_path)}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    print(f"server healthy after {time.monotonic() - start:.0f} s", flush=True)
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server did not answer /health within {timeout:.0f} s:\n{_tail(log_path)}")
