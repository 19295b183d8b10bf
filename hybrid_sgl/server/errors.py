"""Errors in OpenAI's format, on every route: {"error": {"message", "type", "param", "code"}}.

Every bad input ends here as a 4xx naming the cause: ApiError raised by the routes,
ValueError from the engine's validation, pydantic errors from the request models, malformed
JSON (also nested too deep, or text with lone UTF-16 surrogates), unknown routes and methods,
a rid already in use (409). Anything else is a bug and becomes a 500 with the same shape and
`Connection: close`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from hybrid_sgl.request_ids import DuplicateRidError
from hybrid_sgl.sampling_params import SamplingParams
from hybrid_sgl.server.protocol import GenerateRequest

logger = logging.getLogger(__name__)
M = TypeVar("M", bound=BaseModel)

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error", 413: "invalid_request_error",
          415: "invalid_request_error", 422: "invalid_request_error", 500: "internal_server_error",
          503: "service_unavailable"}
MAX_JSON_DEPTH = 64
LARGE_BODY_BYTES = 64 << 10  # bodies above this are parsed on a worker thread
CLOSE = {"Connection": "close"}  # after a 5xx the connection is not reused
_FIELDS = set(GenerateRequest.model_fields) | set(SamplingParams.__dataclass_fields__) | {"seed"}


class ApiError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code


def error_body(message: str, status: int = 400, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def error_response(message: str, status: int = 400, param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> Response:
    return json_response(error_body(message, status, param, code), status, headers)


def json_response(content, status: int = 200, headers: dict | None = None) -> Response:
    return Response(dumps(content), status_code=status, media_type="application/json", headers=headers)


def dumps(content) -> str:
    """JSON text; non-finite floats (a -inf logprob) become null instead of failing."""
    try:
        return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError:
        return json.dumps(_finite(content), ensure_ascii=False, separators=(",", ":"))


def _finite(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


# ---- request bodies ------------------------------------------------------------------------------
def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _int64(text: str) -> int:
    value = int(text)
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"integer {text} is out of the 64-bit range")
    return value


async def parse_body(request: Request, model: type[M]) -> M:
    """The request's JSON body validated against `model`, or ApiError(400) naming the cause.
    Large bodies are parsed on a worker thread so that the event loop keeps serving."""
    raw = await request.body()
    if len(raw) > LARGE_BODY_BYTES:
        return await asyncio.to_thread(_parse, raw, model)
    return _parse(raw, model)


def _parse(raw: bytes, model: type[M]) -> M:
    if not raw.strip():
        raise ApiError("the request body is empty; send a JSON object")
    try:
        data = json.loads(raw, parse_constant=_reject_constant, parse_int=_int64)
    except RecursionError:
        raise ApiError(f"the JSON body is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(f"malformed JSON in the request body: {e}") from None
    if not isinstance(data, dict):
        raise ApiError(f"the request body must be a JSON object, got {type(data).__name__}")
    _check_json(data, (), 0)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        message, param = describe_validation(e.errors())
        raise ApiError(message, param=param) from None


def _check_json(value, path: tuple, depth: int) -> None:
    """Refuse nesting deeper than MAX_JSON_DEPTH and strings that are not valid Unicode (a lone
    UTF-16 surrogate such as "\\ud800" parses in JSON but cannot be tokenized or encoded)."""
    if depth > MAX_JSON_DEPTH:
        raise ApiError(f"the JSON body is nested more than {MAX_JSON_DEPTH} levels deep", param=_dotted(path[:1]))
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ApiError(f"'{_dotted(path)}' contains a lone UTF-16 surrogate at character {e.start}; "
                               "send valid Unicode text", param=_dotted(path)) from None
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_json(key, path + (key,), depth + 1)
            _check_json(item, path + (key,), depth + 1)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, (str, dict, list)):
                _check_json(item, path + (i,), depth + 1)


def _dotted(path: tuple) -> str:
    return ".".join(str(p) for p in path) or "body"


_TYPE_LABELS = {"str", "int", "float", "bool", "dict", "list", "none"}


def _path(loc) -> str:
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p in _TYPE_LABELS))]
    return ".".join(parts) or "body"


def describe_validation(errors: list[dict]) -> tuple[str, str | None]:
    """One readable message for pydantic errors (a union gives one error per member)."""
    by_field: dict[str, list[dict]] = {}
    for e in errors:
        by_field.setdefault(str(e["loc"][0]) if e["loc"] else "body", []).append(e)
    parts = []
    for field, errs in by_field.items():
        if errs[0]["type"] == "extra_forbidden":
            parts.append(f"unknown field '{_path(errs[0]['loc'])}' (not supported by this server)")
        elif errs[0]["type"] == "missing":
            parts.append(f"'{_path(errs[0]['loc'])}' is required")
        elif len(errs) == 1:
            parts.append(f"'{_path(errs[0]['loc'])}': {_message(errs[0])}")
        else:
            wants = " or ".join(dict.fromkeys(_message(e).removeprefix("must be ") for e in errs))
            parts.append(f"'{field}': expected {wants}; got {_short(_top_input(errs))}")
    return "; ".join(parts), next(iter(by_field))


def _message(e: dict) -> str:
    msg = e["msg"]
    if e["type"] in ("value_error", "assertion_error"):
        msg = msg.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return msg.replace("Input should be", "must be")


def _top_input(errs: list[dict]):
    shortest = min(errs, key=lambda e: len(e["loc"]))
    return shortest.get("input")


def _short(value) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _field_named(message: str) -> str | None:
    """The request field an engine message starts with ("top_p must be in (0, 1]..." -> "top_p")."""
    word = message.split(" ", 1)[0].rstrip(":=,")
    return word if word in _FIELDS else None


# ---- handlers ------------------------------------------------------------------------------------
def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, e: ApiError):
        return error_response(e.message, e.status, e.param, e.code, headers=CLOSE if e.status >= 500 else None)

    @app.exception_handler(DuplicateRidError)
    async def _duplicate_rid(_: Request, e: DuplicateRidError):
        return error_response(str(e), 409, param="rid", code="duplicate_rid")

    @app.exception_handler(ValidationError)
    async def _pydantic(_: Request, e: ValidationError):  # a model built inside a route
        message, param = describe_validation(e.errors())
        return error_response(message, 400, param)

    @app.exception_handler(ValueError)
    async def _value_error(_: Request, e: ValueError):  # the engine's input validation
        return error_response(str(e), 400, _field_named(str(e)))

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError):
        message, param = describe_validation(list(e.errors()))
        return error_response(message, 400, param)

    @app.exception_handler(HTTPException)
    async def _http(request: Request, e: HTTPException):
        message = str(e.detail) if e.detail else "request failed"
        if e.status_code == 404:
            message = f"no route {request.method} {request.url.path} on this server"
        elif e.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        return error_response(message, e.status_code, headers=getattr(e, "headers", None))

    @app.exception_handler(Exception)
    async def _internal(request: Request, e: Exception):
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(f"internal server error: {type(e).__name__}: {e}", 500, headers=CLOSE)
