"""The sequences of one request on their way through the engine.

`Prepared` pairs a sequence's Req (engine side, internal id) with its OutputState (client side,
the client's id) and the client ids it answers to. `Submission` is one request handed to the
engine from an asyncio loop: iterate `updates()` for (index, output) after each engine update;
`close()` aborts whatever has not finished and may be called any number of times.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from hybrid_sgl.outputs import OutputState
from hybrid_sgl.scheduler.engine_loop import ReqUpdate
from hybrid_sgl.scheduler.request import Req


@dataclass
class Prepared:
    req: Req
    out: OutputState
    keys: tuple[str, ...]  # the client ids this sequence answers to; keys[-1] is its own


class Submission:
    def __init__(self, prepared: list[Prepared], abort: Callable[[str], None]):
        self.prepared = prepared
        self._abort = abort
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[ReqUpdate] = asyncio.Queue()
        self._by_rid = {p.req.rid: (i, p.out) for i, p in enumerate(prepared)}
        self._pending = len(prepared)
        self.closed = False

    @property
    def outputs(self) -> list[OutputState]:
        return [p.out for p in self.prepared]

    def deliver(self, update: ReqUpdate) -> None:
        """Called on the engine thread."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, update)

    async def updates(self) -> AsyncIterator[tuple[int, OutputState]]:
        while self._pending and not self.closed:
            u = await self._queue.get()
            index, out = self._by_rid[u.rid]
            out.apply(u)
            self._pending -= out.finished
            yield index, out

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for p in self.prepared:
            if not p.out.finished:
                self._abort(p.req.rid)
