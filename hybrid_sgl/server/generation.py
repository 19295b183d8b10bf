"""Running one HTTP request's sequences: outputs as they arrive, abort on disconnect.

The route prepares (off the event loop) and submits at once (`submit`), so that a rid already in
use is a 409 before any response starts. `stream_outputs` then yields (index, OutputState) after
every engine update. A watcher task waits for the client's disconnect and closes the submission,
which aborts the unfinished sequences and frees their state slots and KV pages; closing the
stream early (a streaming response cancelled by Starlette) does the same.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from hybrid_sgl.engine import Engine, EngineCapacity
from hybrid_sgl.outputs import OutputState
from hybrid_sgl.server.errors import ApiError, dumps, error_body
from hybrid_sgl.server.metrics import Metrics
from hybrid_sgl.submission import Submission

MAX_SEQUENCES = 1024  # generated sequences (prompts x n) in one HTTP request
CLIENT_CLOSED = 499  # nginx's code for "client closed request"; nobody reads it


@dataclass
class ServerContext:
    engine: Engine
    metrics: Metrics
    served_model_name: str
    capacity: EngineCapacity  # read once: the limits do not change while the engine runs
    # Tokenizing and detokenizing run here, one at a time, never on the event loop.
    text_worker: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="text"))

    def tokenizer(self, route: str):
        """The engine's tokenizer, or a 400 naming the route when the server runs without one."""
        tok = self.engine.tokenizer
        if tok is None:
            raise ApiError(f"{route} needs a tokenizer, and this server was started with --skip-tokenizer-init; "
                           "send token ids to /generate (input_ids) instead")
        return tok

    @property
    def context_length(self) -> int:
        return self.capacity.context_length

    def check_chars(self, texts: list[str], param: str) -> None:
        """Refuse text too long to fit the context before anything tokenizes it."""
        limit = self.capacity.max_prompt_chars
        total = sum(len(t) for t in texts)
        if total > limit:
            per_token = limit // self.context_length
            raise ApiError(f"{param} has {total} characters; at most {limit} are accepted ({per_token} per token "
                           f"of the context length {self.context_length}): shorten it", param=param)

    async def off_loop(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) on the text worker (tokenizing a huge prompt or detokenizing a long
        answer must not stall /health and the other streams)."""
        return await asyncio.get_running_loop().run_in_executor(self.text_worker, lambda: fn(*args, **kwargs))

    async def json_off_loop(self, build, single: bool = False) -> Response:
        """A JSON response built and serialized on the text worker (detokenizing, logprob lists);
        build() returns a list of results, single=True answers with the first alone."""
        def text() -> str:
            results = build()
            return dumps(results[0] if single else results)

        return Response(await self.off_loop(text), media_type="application/json")


class ClientDisconnected(Exception):
    pass


def get_context(request: Request) -> ServerContext:
    return request.app.state.ctx


def check_fanout(count: int) -> None:
    if count > MAX_SEQUENCES:
        raise ApiError(f"the request asks for {count} sequences (prompts x n); at most {MAX_SEQUENCES} are "
                       "allowed in one request: split it")


async def _close_on_disconnect(request: Request, sub: Submission) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    sub.close()


async def stream_outputs(ctx: ServerContext, request: Request, sub: Submission,
                         track: bool = True) -> AsyncIterator[tuple[int, OutputState]]:
    """Yield (index, output) after each update. If the client goes away, the unfinished sequences
    are aborted and ClientDisconnected is raised at the end. track=False keeps the request out of
    the metrics (health checks)."""
    tracker = ctx.metrics.tracker(len(sub.prepared)) if track else None
    watcher = asyncio.ensure_future(_close_on_disconnect(request, sub))
    try:
        async for index, out in sub.updates():
            if tracker is not None:
                tracker.update(index, out)
            yield index, out
    finally:
        watcher.cancel()
        sub.close()
        if tracker is not None:
            tracker.close()
    if watcher.done() and not watcher.cancelled():
        raise ClientDisconnected()


async def run_to_end(ctx: ServerContext, request: Request, sub: Submission, track: bool = True) -> list[OutputState]:
    """Run until every output finished; ClientDisconnected if the client left first."""
    try:
        async with contextlib.aclosing(stream_outputs(ctx, request, sub, track)) as outputs:
            async for _ in outputs:
                pass
    finally:
        sub.close()
    results = sub.outputs
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


class _ClosingStream(StreamingResponse):
    """A streaming response that closes its events and its submission however it ends (the client
    may leave before the first byte, when Starlette never starts the events)."""

    def __init__(self, events, sub: Submission):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.events, self.sub = events, sub

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.sub.close()
            await self.events.aclose()


def streaming_response(events, sub: Submission) -> Response:
    return _ClosingStream(events, sub)


SSE_DONE = "data: [DONE]\n\n"


def sse(payload) -> str:
    return f"data: {dumps(payload)}\n\n"


def sse_error(status: int, message: str) -> str:
    return sse(error_body(message, status))
