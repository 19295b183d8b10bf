"""Pipelines: how a step that the scheduler chose runs.

The scheduler decides what runs (which requests, how many tokens each, whom to preempt); a pipeline
decides how the step runs on the runner and when its results reach the requests. PlainPipeline runs
every step to its end; OverlapPipeline (overlap.py) keeps a decode step in flight while the host
applies the one before it. A speculative pipeline (draft, verify, commit) fits beside them through
the same entries:

    run(mode, items)   run a scheduled step; returns the requests that got a token or finished
    in_flight          the items of a step launched but not applied yet (None: nothing in flight)
    advance(follow)    launch `follow` (the next batch the scheduler built without the in-flight
                       step's tokens, or None), then apply the step in flight
    takes_follow_up(items)  whether that next batch may go behind the step in flight
    follow_tokens()    tokens a row of the step in flight may gain, and a row behind it writes
    holders()          finished requests whose slot a step in flight still uses
    drop_in_flight()   after a failed step: forget the step in flight, free the slots it held

Results reach the requests through the scheduler (StepHost): its `results` apply each one, then it
may `release` a finished request, or `free_slot` of one released while a step in flight used the slot.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from typing import Protocol

from hybrid_sgl.batch import ForwardMode
from hybrid_sgl.runner.model_runner import BatchItem, ModelRunner
from hybrid_sgl.scheduler.request import Req, ReqStatus
from hybrid_sgl.scheduler.results import ResultApplier
from hybrid_sgl.scheduler.sharing import BasePrefixSharing


class StepHost(Protocol):
    """What a pipeline needs of the scheduler."""

    sharing: BasePrefixSharing
    waiting: deque[Req]
    running: list[Req]
    results: ResultApplier

    def release(self, req: Req, free_slot: bool = True, cache: bool = True) -> None: ...
    def free_slot(self, req: Req, cached: int | None) -> None: ...


class StepPipeline(ABC):
    """One way of running steps; its entries are those listed at the top of this module."""

    num_overlapped_steps = 0  # decode steps launched before the previous one's tokens were read
    accept_length = 0.0  # speculative decoding: mean tokens a verify row gains (0.0 without)

    def __init__(self, runner: ModelRunner, host: StepHost):
        self.runner, self.host = runner, host
        self.computed_prompt_tokens = 0  # tokens run through extend steps (prompts and recomputes)

    @abstractmethod
    def run(self, mode: ForwardMode, items: list[BatchItem]) -> list[Req]: ...
    @property
    @abstractmethod
    def in_flight(self) -> list[BatchItem] | None: ...
    @abstractmethod
    def advance(self, follow: tuple[list[BatchItem], list[int]] | None) -> list[Req]: ...
    @abstractmethod
    def holders(self) -> list[Req]: ...
    @abstractmethod
    def drop_in_flight(self) -> None: ...

    def follow_tokens(self) -> int:
        """The most tokens a row of the step in flight gains, which is also what a row of a step behind it
        writes: 1 for decode steps, k + 1 for chained speculative iterations."""
        return 1

    def takes_follow_up(self, items: list[BatchItem]) -> bool:
        """Whether `items`, the next decode batch the scheduler built from the step in flight, may be
        launched behind it; False: the step in flight is read first and the batch is scheduled anew."""
        return True

    def run_to_end(self, mode: ForwardMode, items: list[BatchItem]) -> list[Req]:
        """Run a step, wait for it and apply its results. An extend step takes the prefix cache's
        snapshots inside its chunks and hands the cache what its chunks computed while the device
        computes them: the cache records slots and pages, and its own state copies queue behind the
        step, so nothing reads a snapshot before the step has written it."""
        host, extend = self.host, mode is ForwardMode.EXTEND
        if not extend:
            results = self.runner.run(mode, items)
            return self._apply(items, results)
        host.sharing.plan_snapshots(items, host.waiting)
        try:
            results = self.runner.run(mode, items, while_running=lambda: self._cache_chunks(items))
        except BaseException:
            host.sharing.drop_snapshots(items)  # those the cache has not taken yet
            raise
        self.computed_prompt_tokens += sum(it.end - it.start for it in items)
        return self._apply(items, results)

    def _cache_chunks(self, items: list[BatchItem]) -> None:
        """The snapshots inside the step's chunks, and each chunk's prefix and end state, go into the
        cache (a request that finishes in this step caches its sequence again at release: the same
        entries)."""
        for item in items:
            self.host.sharing.snapshots_done(item)
            if item.req.status is ReqStatus.RUNNING:
                self.host.sharing.chunk_done(item.req, item.end)

    def _apply(self, items: list[BatchItem], results) -> list[Req]:
        changed = [item.req for item, result in zip(items, results) if self.host.results.apply(item, result)]
        for req in changed:
            if req.finished:
                self.host.release(req)
        return changed


class PlainPipeline(StepPipeline):
    """Every step runs to its end before the next one is scheduled."""

    def run(self, mode: ForwardMode, items: list[BatchItem]) -> list[Req]:
        return self.run_to_end(mode, items)

    @property
    def in_flight(self) -> None:
        return None

    def advance(self, follow: tuple[list[BatchItem], list[int]] | None) -> list[Req]:
        raise RuntimeError("the plain pipeline keeps no step in flight")

    def holders(self) -> list[Req]:
        return []

    def drop_in_flight(self) -> None:
        pass
