"""The FastAPI application: routes, error handlers, request guards and CORS around one Engine."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware

from hybrid_sgl.engine import Engine
from hybrid_sgl.server import native, openai_chat, openai_common, openai_completions, tokenize
from hybrid_sgl.server.errors import install_error_handlers
from hybrid_sgl.server.generation import ServerContext
from hybrid_sgl.server.guards import RequestGuard
from hybrid_sgl.server.metrics import Metrics, public_model_name
from hybrid_sgl.server.openai_common import TokenText
from hybrid_sgl.server.openapi import install_openapi
from hybrid_sgl.version import __version__

MAX_BODY_BYTES = 64 << 20  # a request body above this is refused (413)


def create_app(engine: Engine) -> FastAPI:
    args = engine.server_args
    app = FastAPI(title="hybrid_sgl", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    capacity = engine.capacity()
    metrics = Metrics(public_model_name(args.served_model_name, args.model_path),
                      max_total_num_tokens=capacity.max_total_tokens, context_len=capacity.context_length)
    app.state.ctx = ServerContext(engine=engine, metrics=metrics, served_model_name=args.served_model_name,
                                  capacity=capacity)
    app.state.token_text = TokenText(engine.tokenizer) if engine.tokenizer is not None else None
    install_error_handlers(app)
    for module in (native, openai_common, openai_completions, openai_chat, tokenize):
        app.include_router(module.router)
    install_openapi(app)
    app.add_middleware(RequestGuard, max_body_bytes=MAX_BODY_BYTES, api_key=args.api_key)
    origins = [o.strip() for o in (args.allowed_origins or "").split(",") if o.strip()]
    if origins:  # no CORS headers at all unless asked for
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_methods=["*"], allow_headers=["*"])
    return app
