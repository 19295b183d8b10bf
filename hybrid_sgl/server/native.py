"""SGLang's native API: /generate (single, batch, n, streaming, logprobs), model and server info,
health, cache flush, abort, metrics. Shapes follow sglang.srt.entrypoints.http_server."""

from __future__ import annotations

import asyncio
import contextlib

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from hybrid_sgl.server.errors import ApiError, json_response, parse_body
from hybrid_sgl.server.generation import (
    SSE_DONE,
    ClientDisconnected,
    ServerContext,
    check_fanout,
    engine_error,
    get_context,
    off_loop,
    run_to_end,
    sse,
    sse_error,
    stream_outputs,
)
from hybrid_sgl.server.metrics import engine_stats
from hybrid_sgl.server.protocol import AbortRequest, GenerateRequest, unsupported_fields
from hybrid_sgl.version import __version__

router = APIRouter()
HEALTH_TIMEOUT_S = 20.0
CLIENT_CLOSED = 499  # nginx's code for "client closed request"; nobody reads it


async def on_engine(ctx: ServerContext, fn):
    """Run fn(scheduler) on the engine thread without blocking the event loop."""
    return await asyncio.wrap_future(ctx.engine.loop.call(fn))


@router.api_route("/generate", methods=["POST", "PUT"])
async def generate(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, GenerateRequest)
    bad = unsupported_fields(body, GenerateRequest.NOT_SUPPORTED)
    if bad:
        raise ApiError(f"{bad[0]} is not supported yet", param=bad[0])
    check_fanout(_num_sequences(body))
    prepared, single = await off_loop(request, ctx.engine.prepare, body.text, body.sampling_params, body.input_ids,
                                      body.return_logprob, body.logprob_start_len, body.top_logprobs_num,
                                      body.return_text_in_logprobs, body.rid)
    if body.stream:
        return streaming_response(_generate_events(ctx, request, prepared, single, body.log_metrics))
    try:
        outputs = await run_to_end(ctx, request, prepared, body.log_metrics)
    except ClientDisconnected:
        return Response(status_code=CLIENT_CLOSED)
    results = [out.to_dict() for out in outputs]
    return json_response(results[0] if single else results)


async def _generate_events(ctx: ServerContext, request: Request, prepared, single: bool, track: bool):
    async with contextlib.aclosing(stream_outputs(ctx, request, prepared, track)) as outputs:
        try:
            async for index, out in outputs:
                error = engine_error(out)
                if error is not None:
                    yield sse_error(*error)
                    break
                chunk = out.to_dict(stream=True)
                if not single:
                    chunk["index"] = index
                yield sse(chunk)
        except ClientDisconnected:
            return
    yield SSE_DONE


def streaming_response(events) -> StreamingResponse:
    """SSE response; closing `events` afterwards aborts what is still running if the client left."""
    return StreamingResponse(events, media_type="text/event-stream", background=BackgroundTask(events.aclose),
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def _num_sequences(body: GenerateRequest) -> int:
    """Prompts x n, counted before anything is tokenized (malformed values are left to the engine)."""
    single = isinstance(body.text, str) or bool(body.input_ids and isinstance(body.input_ids[0], int))
    prompts = 1 if single else len(body.text or body.input_ids or [])
    params = body.sampling_params if isinstance(body.sampling_params, list) else [body.sampling_params or {}] * prompts
    ns = [p.get("n") for p in params]
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
    try:
        await asyncio.wait_for(run_to_end(ctx, request, prepared, track=False), HEALTH_TIMEOUT_S)
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
    stats = await on_engine(ctx, engine_stats)
    stats["last_gen_throughput"] = ctx.metrics.throughput()
    return json_response({**info, "internal_states": [stats], "version": __version__})


@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache():
    # There is no prefix cache yet, so there is never anything to flush.
    return PlainTextResponse("Cache flushed.\n")


@router.post("/abort_request")
async def abort_request(request: Request):
    ctx = get_context(request)
    body = await parse_body(request, AbortRequest)
    ctx.engine.abort(body.rid)
    return Response(status_code=200)


@router.get("/debug/allocator")
async def allocator_state(request: Request):
    """Pool usage and the allocator's integrity check (for tests and operators)."""
    ctx = get_context(request)

    def check(scheduler):
        stats = engine_stats(scheduler)
        try:
            scheduler.allocator.check_integrity()
            stats["integrity"] = "ok"
        except AssertionError as e:
            stats["integrity"] = f"violated: {e}"
        return stats

    return json_response(await on_engine(ctx, check))


@router.get("/metrics")
async def metrics(request: Request):
    ctx = get_context(request)
    stats = await on_engine(ctx, engine_stats)
    return PlainTextResponse(ctx.metrics.render(stats), media_type="text/plain; version=0.0.4")
