"""Structured outputs on the HTTP routes: OpenAI's response_format as a grammar, and the 400 for a
grammar that does not compile, given before the request is submitted (and before a stream starts).

response_format (OpenAI, plus SGLang's structural_tag):
    {"type": "text"}                                        no constraint
    {"type": "json_object"}                                 any JSON object
    {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
    {"type": "structural_tag", "structures": [...], "triggers": [...]}
"""

from __future__ import annotations

import json

from hybrid_sgl.engine import Engine
from hybrid_sgl.server.errors import ApiError
from hybrid_sgl.submission import Prepared

JSON_OBJECT = '{"type": "object"}'


def response_format_params(rf: dict | None) -> dict:
    """The sampling_params fields a response_format stands for ({} for none or "text")."""
    if rf is None:
        return {}
    kind = rf.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_schema": JSON_OBJECT}
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict):
            raise ApiError("response_format json_schema needs a json_schema object: "
                           '{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}',
                           param="response_format")
        schema = spec.get("schema", spec.get("schema_"))
        if schema is None:
            return {"json_schema": JSON_OBJECT}  # OpenAI allows a schema-less entry: any object
        if not isinstance(schema, dict):
            raise ApiError("response_format json_schema.schema must be a JSON object", param="response_format")
        return {"json_schema": json.dumps(schema)}
    if kind == "structural_tag":
        return {"structural_tag": json.dumps({k: v for k, v in rf.items() if k != "type"})}
    raise ApiError(f"response_format type {kind!r} is not supported; use text, json_object, json_schema or "
                   "structural_tag", param="response_format")


async def grammars_compiled(engine: Engine, prepared: list[Prepared]) -> None:
    """Wait, off the event loop's back, until the grammars of `prepared` (engine sequences) have
    compiled; ApiError(400) naming the field and the problem when one is invalid or too slow."""
    refused = await engine.grammar_ready(prepared)
    if refused is not None:
        field, message = refused
        raise ApiError(message, param=field)
