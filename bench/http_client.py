"""HTTP helpers of bench/serving.py and bench/prefix_cache.py (standard library only): a small asyncio
HTTP/1.1 client (one connection per request, JSON bodies, chunked or sized responses, server-sent events
with the arrival time of each event), and `launched_server`, which starts `python -m
hybrid_sgl.launch_server` in a subprocess, waits for /health, and stops it (Ctrl-C, as a user would)
when the benchmark is done."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from urllib.parse import urlsplit


class HTTPError(RuntimeError):
    def __init__(self, status: int, body: bytes):
        super().__init__(f"HTTP {status}: {body[:500].decode(errors='replace')}")
        self.status = status


class Response:
    def __init__(self, status: int, headers: dict[str, str], reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter):
        self.status = status
        self.headers = headers
        self.reader = reader
        self.writer = writer

    async def pieces(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked transfer decoded)."""
        r = self.reader
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await r.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while (await r.readline()).strip():  # trailers
                        pass
                    return
                data = await r.readexactly(size)
                await r.readexactly(2)  # CRLF after the chunk
                yield data
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await r.read(min(left, 1 << 16))
                if not data:
                    raise ConnectionError("connection closed before the end of the body")
                left -= len(data)
                yield data
        else:
            while data := await r.read(1 << 16):
                yield data

    async def body(self) -> bytes:
        return b"".join([piece async for piece in self.pieces()])

    async def events(self) -> AsyncIterator[tuple[float, str]]:
        """Server-sent events: (time.perf_counter() when the event's last byte arrived, data)."""
        buffer = b""
        async for piece in self.pieces():
            arrived = time.perf_counter()
            buffer += piece.replace(b"\r\n", b"\n")
            while b"\n\n" in buffer:
                event, buffer = buffer.split(b"\n\n", 1)
                data = [line[5:].lstrip() for line in event.split(b"\n") if line.startswith(b"data:")]
                if data:
                    yield arrived, b"\n".join(data).decode()

    def close(self) -> None:
        self.writer.close()


async def open_request(url: str, method: str = "GET", payload: dict | None = None,
                       headers: dict[str, str] | None = None, timeout: float | None = None) -> Response:
    """Send the request; returns once the status line and headers are in."""
    parts = urlsplit(url)
    secure = parts.scheme == "https"
    port = parts.port or (443 if secure else 80)
    body = json.dumps(payload).encode() if payload is not None else b""
    lines = [f"{method} {parts.path or '/'}{'?' + parts.query if parts.query else ''} HTTP/1.1",
             f"Host: {parts.hostname}:{port}", "Connection: close", "Accept: */*",
             f"Content-Length: {len(body)}"]
    if payload is not None:
        lines.append("Content-Type: application/json")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    connect = asyncio.open_connection(parts.hostname, port, ssl=ssl.create_default_context() if secure else None,
                                      limit=1 << 24)
    reader, writer = await asyncio.wait_for(connect, timeout)
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), timeout)
    if not status_line:
        writer.close()
        raise ConnectionError(f"{url}: the server closed the connection without answering")
    status = int(status_line.split()[1])
    response_headers = {}
    while (line := await reader.readline()).strip():
        name, _, value = line.decode("latin-1").partition(":")
        response_headers[name.strip().lower()] = value.strip()
    return Response(status, response_headers, reader, writer)


async def fetch(url: str, method: str = "GET", payload: dict | None = None, headers: dict[str, str] | None = None,
                timeout: float | None = 30.0) -> bytes:
    """Whole body of a request; HTTPError unless the status is 2xx."""
    response = await open_request(url, method, payload, headers, timeout)
    try:
        body = await asyncio.wait_for(response.body(), timeout)
    finally:
        response.close()
    if not 200 <= response.status < 300:
        raise HTTPError(response.status, body)
    return body


async def fetch_json(url: str, **kwargs):
    return json.loads(await fetch(url, **kwargs))


# ---- --launch: a server in a subprocess ---------------------------------------------------------
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tail(path: str, lines: int = 30) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


@contextlib.contextmanager
def launched_server(server_args: str, log_path: str, timeout: float, launcher: list[str] | None = None):
    """Yields the server's base URL. `launcher`: the Python arguments that start the server (default
    ["-m", "hybrid_sgl.launch_server"]); the server arguments follow them."""
    args = shlex.split(server_args)
    if "--port" not in args:
        args += ["--port", str(_free_port())]
    port = args[args.index("--port") + 1]
    host = args[args.index("--host") + 1] if "--host" in args else "127.0.0.1"
    url = f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, *(launcher or ["-m", "hybrid_sgl.launch_server"]), *args]
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
