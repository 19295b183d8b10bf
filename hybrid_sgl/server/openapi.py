"""/openapi.json and /docs from the request models the routes really validate against.

Routes parse their bodies themselves (strict JSON, clear 400s), so FastAPI cannot see the body
models; each route names its model through `body_schema(Model)` and `install_openapi` puts the
models' JSON schemas under components/schemas.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from hybrid_sgl.server.errors import json_response

REF = "#/components/schemas/{model}"
_MODELS: dict[str, type[BaseModel]] = {}


def body_schema(model: type[BaseModel]) -> dict:
    """openapi_extra for a route whose JSON body is `model`."""
    _MODELS[model.__name__] = model
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}}}


def install_openapi(app: FastAPI) -> None:
    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes,
                                 description="SGLang's native API and the OpenAI-compatible API.")
            _, defs = models_json_schema([(m, "validation") for m in _MODELS.values()], ref_template=REF)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi_json():
        return json_response(app.openapi())

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} API")
