"""RequestGuard: the checks every HTTP request passes before a route sees it (plain ASGI, so that
client disconnects still reach the routes).

- the API key, when one is set: one 'Authorization: Bearer <key>' header (401 otherwise), except on
  OPEN_PATHS. The same header twice counts as one: sglang-router with --api-key forwards the
  client's header and adds its own; two different ones are refused, never one picked;
- a browser cannot start work through a "simple" cross-site request: a request that carries an
  Origin header must send its body as application/json (415), which makes the browser ask first
  (CORS preflight) and obey --allowed-origins; `curl -d` sends no Origin and keeps working;
- the body is at most `max_body_bytes` (413), by Content-Length and while reading;
- every 5xx response closes the connection (`Connection: close`).
"""

from __future__ import annotations

import secrets

from hybrid_sgl.server.errors import ApiError, dumps, error_body

OPEN_PATHS = ("/health", "/health_generate", "/metrics")  # reachable without the API key, as in SGLang
BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")


class RequestGuard:
    def __init__(self, app, max_body_bytes: int, api_key: str | None):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.api_key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await _send_error(send, *refusal)
            return
        await self.app(scope, self._limited(receive), _closing_on_5xx(send))

    def _refusal(self, scope, headers) -> tuple[int, str, str | None, list] | None:
        if self.api_key is not None and scope["path"] not in OPEN_PATHS:
            auths = {v for n, v in headers if n == b"authorization"}
            if len(auths) != 1:
                why = "missing API key" if not auths else f"{len(auths)} different Authorization headers"
                return 401, f"{why}: send exactly one 'Authorization: Bearer <key>' header", "invalid_api_key", \
                    [(b"www-authenticate", b"Bearer")]
            scheme, _, token = next(iter(auths)).partition(b" ")
            if scheme.lower() != b"bearer" or not secrets.compare_digest(token.strip(), self.api_key):
                return 401, "wrong API key: send 'Authorization: Bearer <key>'", "invalid_api_key", \
                    [(b"www-authenticate", b"Bearer")]
        if scope["method"] in BODY_METHODS and any(n == b"origin" for n, _ in headers):
            ctype = next((v for n, v in headers if n == b"content-type"), b"")
            if ctype.split(b";")[0].strip().lower() != b"application/json":
                return 415, ("a request from a web page (Origin header) must send Content-Type: application/json, "
                             f"got {ctype.decode('latin-1') or 'none'!r}"), None, []
        length = next((v for n, v in headers if n == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return 413, self._too_large(int(length)), None, []
        return None

    def _too_large(self, size: int) -> str:
        return f"the request body has {size} bytes; at most {self.max_body_bytes} are accepted"

    def _limited(self, receive):
        total = 0

        async def limited():
            nonlocal total
            message = await receive()
            if message["type"] == "http.request":
                total += len(message.get("body", b""))
                if total > self.max_body_bytes:
                    raise ApiError(self._too_large(total) + " (counted while reading)", 413)
            return message

        return limited


def _closing_on_5xx(send):
    async def closing(message):
        if message["type"] == "http.response.start" and message["status"] >= 500:
            headers = [(n, v) for n, v in message.get("headers", []) if n.lower() != b"connection"]
            message = {**message, "headers": headers + [(b"connection", b"close")]}
        await send(message)

    return closing


async def _send_error(send, status: int, message: str, code: str | None, extra: list) -> None:
    body = dumps(error_body(message, status, code=code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *extra]})
    await send({"type": "http.response.body", "body": body})
