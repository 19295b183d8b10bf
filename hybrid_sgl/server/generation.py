"""Running prepared requests for one HTTP request: outputs as they arrive, abort on disconnect.

`stream_outputs` yields (index, OutputState) after every engine update. A watcher task waits
for the client's disconnect and then aborts the unfinished requests, which frees their state
slots and KV pages; closing the stream early (a streaming response cancelled by Starlette)
aborts them too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi import Request

from hybrid_sgl.engine import Engine
from hybrid_sgl.outputs import OutputState
from hybrid_sgl.server.errors import ApiError, dumps, error_body
from hybrid_sgl.server.metrics import Metrics

LARGE_BODY_BYTES = 64 << 10
MAX_SEQUENCES = 4096  # generated sequences (prompts x n) in one HTTP request


@dataclass
class ServerContext:
    engine: Engine
    metrics: Metrics
    served_model_name: str
    context_length: int

    def tokenizer(self, route: str):
        """The engine's tokenizer, or a 400 naming the route when the server runs without one."""
        tok = self.engine.tokenizer
        if tok is None:
            raise ApiError(f"{route} needs a tokenizer, and this server was started with --skip-tokenizer-init; "
                           "send token ids to /generate (input_ids) instead")
        return tok


class ClientDisconnected(Exception):
    pass


def get_context(request: Request) -> ServerContext:
    return request.app.state.ctx


def check_fanout(count: int) -> None:
    if count > MAX_SEQUENCES:
        raise ApiError(f"the request asks for {count} sequences (prompts x n); at most {MAX_SEQUENCES} are "
                       "allowed in one request: split it")


async def off_loop(request: Request, fn, *args, **kwargs):
    """fn(*args, **kwargs), on a worker thread when the request body is large (tokenizing a huge
    prompt must not stall the other streams on the event loop)."""
    if len(await request.body()) > LARGE_BODY_BYTES:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)


async def _abort_on_disconnect(request: Request, ctx: ServerContext, prepared) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    for p in prepared:
        if not p.out.finished:
            ctx.engine.abort(p.req.rid)


async def stream_outputs(ctx: ServerContext, request: Request, prepared,
                         track: bool = True) -> AsyncIterator[tuple[int, OutputState]]:
    """Submit `prepared` and yield (index, output) after each update. If the client goes away, the
    unfinished requests are aborted (their last update says so) and ClientDisconnected is raised
    at the end. track=False keeps the request out of the metrics (health checks)."""
    updates = ctx.engine.stream_updates(prepared)
    tracker = ctx.metrics.tracker(len(prepared)) if track else None
    watcher = asyncio.ensure_future(_abort_on_disconnect(request, ctx, prepared))
    try:
        async for index, out in updates:
            if tracker is not None:
                tracker.update(index, out)
            yield index, out
    finally:
        watcher.cancel()
        await updates.aclose()  # aborts whatever has not finished
        if tracker is not None:
            tracker.close()
    if watcher.done() and not watcher.cancelled():
        raise ClientDisconnected()


async def run_to_end(ctx: ServerContext, request: Request, prepared, track: bool = True) -> list[OutputState]:
    """Run until every output finished; ClientDisconnected if the client left first."""
    async with contextlib.aclosing(stream_outputs(ctx, request, prepared, track)) as outputs:
        async for _ in outputs:
            pass
    results = [p.out for p in prepared]
    raise_if_failed(results)
    return results


def raise_if_failed(outputs: list[OutputState]) -> None:
    """An engine-side failure (an abort carrying a status code) becomes an HTTP error."""
    for out in outputs:
        error = engine_error(out)
        if error is not None:
            raise ApiError(error[1], error[0])


def engine_error(out: OutputState) -> tuple[int, str] | None:
    reason = out.finish_reason or {}
    if reason.get("type") == "abort" and isinstance(reason.get("status_code"), int):
        return reason["status_code"], reason.get("message") or "the request was aborted"
    return None


SSE_DONE = "data: [DONE]\n\n"


def sse(payload) -> str:
    return f"data: {dumps(payload)}\n\n"


def sse_error(status: int, message: str) -> str:
    return sse(error_body(message, status))
