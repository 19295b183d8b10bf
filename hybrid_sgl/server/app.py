"""The FastAPI application: routes, error handlers and the API-key check around one Engine."""

from __future__ import annotations

import secrets

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from hybrid_sgl.engine import Engine
from hybrid_sgl.server import native, openai_chat, openai_common, openai_completions, tokenize
from hybrid_sgl.server.errors import dumps, error_body, install_error_handlers
from hybrid_sgl.server.generation import ServerContext
from hybrid_sgl.server.metrics import Metrics
from hybrid_sgl.server.openai_common import TokenText
from hybrid_sgl.version import __version__

OPEN_PATHS = ("/health", "/health_generate", "/metrics")  # reachable without the API key, as in SGLang


def create_app(engine: Engine) -> FastAPI:
    args = engine.server_args
    app = FastAPI(title="hybrid_sgl", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ctx = ServerContext(engine=engine, metrics=Metrics(args.served_model_name),
                                  served_model_name=args.served_model_name,
                                  context_length=engine.runner.context_length)
    app.state.token_text = TokenText(engine.tokenizer) if engine.tokenizer is not None else None
    install_error_handlers(app)
    for module in (native, openai_common, openai_completions, openai_chat, tokenize):
        app.include_router(module.router)
    if args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=args.api_key)
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"])
    return app


class ApiKeyMiddleware:
    """Requires 'Authorization: Bearer <key>' except on OPEN_PATHS. Plain ASGI (not
    BaseHTTPMiddleware) so that client disconnects still reach the routes."""

    def __init__(self, app, api_key: str):
        self.app = app
        self.api_key = api_key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        body = dumps(error_body("missing or wrong API key: send 'Authorization: Bearer <key>'", 401,
                                code="invalid_api_key")).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b"Bearer")]})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                return scheme.lower() == b"bearer" and secrets.compare_digest(token.strip(), self.api_key)
        return False
