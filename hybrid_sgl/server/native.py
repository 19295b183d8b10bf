"""SGLang's native API: /generate (single, batch, n, streaming, logprobs), model and server info,
health, load, cache flush, abort, metrics. Shapes follow sglang.srt.entrypoints.http_server."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response

from hybrid_sgl.server.errors import ApiError, json_response, parse_body
from hybrid_sgl.server.generation import (
    CLIENT_CLOSED,
    SSE_DONE,
    ClientDisconnected,
    ServerContext,
    check_fanout,
    engine_error,
    get_context,
    run_to_end,
    sse,
    sse_error,
    stream_outputs,
    streaming_response,
)
from hybrid_sgl.server.openapi import body_schema
from hybrid_sgl.server.protocol import AbortRequest, GenerateRequest, unsupported_fields
from hybrid_sgl.server.structured import grammars_compiled
from hybrid_sgl.submission import Submission
from hybrid_sgl.version import __version__

router = APIRouter()
HEALTH_TIMEOUT_S = 20.0


@router.post("/generate", openapi_extra=body_schema(GenerateRequest))
@router.put("/generate", openapi_extra=body_schema(GenerateRequest))  # one route per method: unique operation ids
async def generate(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, GenerateRequest)
    bad = unsupported_fields(body, GenerateRequest.NOT_SUPPORTED)
    if bad:
        raise ApiError(f"{bad[0]} is not supported yet", param=bad[0])
    check_fanout(_num_sequences(body))
    prepared, single = await ctx.off_loop(ctx.engine.prepare, body.text, body.sampling_params, body.input_ids,
                                          body.return_logprob, body.logprob_start_len, body.top_logprobs_num,
                                          body.return_text_in_logprobs, body.rid, body.token_ids_logprob)
    await grammars_compiled(ctx.engine, prepared)
    sub = ctx.engine.submit(prepared)
    if body.stream:
        return streaming_response(_generate_events(ctx, request, sub, single, body.log_metrics), sub)
    try:
        outputs = await run_to_end(ctx, request, sub, body.log_metrics)
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    return await ctx.json_off_loop(lambda: [out.to_dict() for out in outputs], single)


async def _generate_events(ctx: ServerContext, request: Request, sub: Submission, single: bool, track: bool):
    async with contextlib.aclosing(stream_outputs(ctx, request, sub, track)) as outputs:
        try:
            async for index, out in outputs:
                error = engine_error(out)
                if error is not None:
                    yield sse_error(*error)
                    break
                chunk = await ctx.off_loop(out.to_dict, stream=True) if out.finished else out.to_dict(stream=True)
                if not single:
                    chunk["index"] = index
                yield sse(chunk)
        except ClientDisconnected:
            return
    yield SSE_DONE


def _num_sequences(body: GenerateRequest) -> int:
    """Prompts x n, counted before anything is tokenized (malformed values are left to the engine)."""
    single = isinstance(body.text, str) or bool(body.input_ids and isinstance(body.input_ids[0], int))
    prompts = 1 if single else len(body.text or body.input_ids or [])
    params = body.sampling_params if isinstance(body.sampling_params, list) else [body.sampling_params or {}] * prompts
    ns = [p.get("n") for p in params if isinstance(p, dict)]
    return sum(n if isinstance(n, int) and n > 1 else 1 for n in ns)


@router.get("/health")
async def health():
    return Response(status_code=200)


@router.get("/health_generate")
async def health_generate(request: Request):
    """Healthy when the engine generates one token in time."""
    ctx = get_context(request)
    prepared, _ = ctx.engine.prepare(None, {"max_new_tokens": 1, "temperature": 0}, [0], False, None, None,
                                     False, None)
    sub = ctx.engine.submit(prepared)
    try:
        await asyncio.wait_for(run_to_end(ctx, request, sub, track=False), HEALTH_TIMEOUT_S)
    except (TimeoutError, ApiError):
        return Response(status_code=503)
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    return Response(status_code=200)


@router.get("/get_model_info")
@router.get("/model_info")
async def model_info(request: Request):
    ctx = get_context(request)
    args, config = ctx.engine.server_args, ctx.engine.model_config
    return json_response({
        "model_path": args.model_path,
        "tokenizer_path": args.tokenizer_path,
        "served_model_name": ctx.served_model_name,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "load_format": args.load_format,
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": config.model_type,
        "architectures": [config.architecture],
        "context_length": ctx.context_length,
    })


@router.get("/get_server_info")
@router.get("/server_info")
async def server_info(request: Request):
    ctx = get_context(request)
    info = ctx.engine.server_info()
    if info.get("api_key"):
        info["api_key"] = "<redacted>"
    stats = await ctx.engine.async_stats()
    stats["last_gen_throughput"] = ctx.metrics.throughput()
    return json_response({**info, "internal_states": [stats], "version": __version__})


@router.get("/get_load")
async def get_load(request: Request):
    """The load of each data-parallel rank (one here), in SGLang's shape. num_tokens counts the KV
    tokens held by running requests (pages the prefix cache could evict are free) plus the prompts
    still waiting; sglang-router sums it over ranks for its power_of_two policy and /get_loads."""
    stats = await get_context(request).engine.async_stats()
    used = (stats["num_pages"] - stats["num_free_pages"] - stats["evictable_pages"]) * stats["page_size"]
    pending = stats["num_pending_tokens"]
    waiting = stats["num_waiting_reqs"] - stats["num_compiling_reqs"]  # those whose grammar is ready
    return json_response([{"dp_rank": 0, "num_reqs": stats["num_running_reqs"] + waiting, "num_waiting_reqs": waiting,
                           "num_tokens": used + pending, "num_pending_tokens": pending}])


@router.get("/flush_cache")
@router.post("/flush_cache")
async def flush_cache(request: Request):
    """Empty the prefix cache when no request runs or waits, as SGLang; else a 400 in OpenAI's error
    shape and the cache stays."""
    if await get_context(request).engine.async_flush_cache():
        return PlainTextResponse("Cache flushed.\n")
    raise ApiError("Cache not flushed: requests are running or waiting; retry when the server is idle",
                   code="server_busy")


@router.post("/abort_request", openapi_extra=body_schema(AbortRequest))
async def abort_request(request: Request):
    """Aborts every running sequence that answers to `rid`: the request, its samples (`rid-j`) and
    batch items (`rid-i`). 200 even when nothing runs under that id, as in SGLang."""
    ctx = get_context(request)
    body = await parse_body(request, AbortRequest)
    ctx.engine.abort(body.rid)
    return Response(status_code=200)


@router.get("/debug/allocator")
async def allocator_state(request: Request):
    """Pool usage and the integrity check, plus what requests leave behind if anything leaks:
    output sinks on the engine thread, reserved rids, asyncio tasks (for tests and operators)."""
    stats = await get_context(request).engine.async_stats(check=True)
    stats["asyncio_tasks"] = len(asyncio.all_tasks())
    return json_response(stats)


@router.get("/metrics")
async def metrics(request: Request):
    ctx = get_context(request)
    stats = await ctx.engine.async_stats()
    return Response(ctx.metrics.render(stats), media_type=ctx.metrics.content_type)
