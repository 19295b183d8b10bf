"""A small asyncio HTTP/1.1 client (standard library only) for the load generator: one connection
per request, JSON bodies, chunked or sized responses, and server-sent events with the arrival
time of each event."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
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
