"""Overlapped decode: a run of decode steps is pipelined.

Step N+1 is launched (its input tokens are step N's samples, still on the device) before the host
reads step N's tokens, so the host's bookkeeping overlaps the device's work. A decode batch starts
the run when it may go without the host reading its tokens first (ModelRunner.can_overlap); the
scheduler then builds each next batch from the step in flight (Scheduler._follow_up), and every
other step (prompt work, arrivals, memory pressure, logprobs) runs to its end after the step in
flight has been read.

A request that stops at step N (EOS, stop token or string, abort) wastes its row of step N+1,
which is discarded; its slot is freed only after that step, with the state after all its tokens
going into the prefix cache then.
"""

from __future__ import annotations

from hybrid_sgl.batch import ForwardMode
from hybrid_sgl.runner.model_runner import BatchItem, ModelRunner, PendingDecode
from hybrid_sgl.scheduler.pipeline import StepHost, StepPipeline
from hybrid_sgl.scheduler.request import Req, ReqStatus


class OverlapPipeline(StepPipeline):
    def __init__(self, runner: ModelRunner, host: StepHost):
        super().__init__(runner, host)
        self._pending: PendingDecode | None = None  # the step in flight
        self.num_overlapped_steps = 0

    @property
    def in_flight(self) -> list[BatchItem] | None:
        return self._pending.items if self._pending is not None else None

    def holders(self) -> list[Req]:
        return list(self._pending.deferred) if self._pending is not None else []

    def run(self, mode: ForwardMode, items: list[BatchItem]) -> list[Req]:
        if mode is ForwardMode.DECODE and self.runner.can_overlap(items):
            self._pending = self.runner.launch_decode(items)  # no step before it: its masks are ready
            return []
        return self.run_to_end(mode, items)

    def advance(self, follow: tuple[list[BatchItem], list[int]] | None) -> list[Req]:
        """Launch `follow` (items, and for each the row of the step in flight whose token it takes)
        behind the step in flight, then read and apply that step."""
        pending, launched, late = self._pending, None, False
        if follow is not None:
            items, rows = follow
            late = samples_late(items)
            launched = self.runner.launch_decode(items, pending, rows, sample=not late)
            self.num_overlapped_steps += 1
        self._pending = launched
        changed = self._resolve(pending)
        if late:  # pending's tokens have advanced the matchers: the masks are ready now
            self.runner.sample_pending(launched)
        return changed

    def drop_in_flight(self) -> None:
        if self._pending is not None:
            for req in self._pending.deferred:
                self.host.free_slot(req, None)
            self._pending = None

    def _resolve(self, pending: PendingDecode) -> list[Req]:
        """Wait for `pending`, apply its tokens; a request that finishes while it is also in the step
        now in flight keeps its slot until that step is read."""
        host = self.host
        try:
            results = pending.results()
        except BaseException:  # the step is over all the same: the slots it held are free
            for req in pending.deferred:
                host.free_slot(req, None)
            raise
        for req in pending.deferred:  # this step fed their last token: the state is after all of fill_ids
            host.free_slot(req, req.num_computed + 1)
        changed = [item.req for item, result in zip(pending.items, results)
                   if item.req.status is ReqStatus.RUNNING and host.results.apply(item, result)]
        next_reqs = {id(it.req) for it in self._pending.items} if self._pending is not None else set()
        for req in changed:
            if not req.finished:
                continue
            if id(req) in next_reqs:
                host.release(req, free_slot=False)
                self._pending.deferred.append(req)
            else:
                host.release(req)
        return changed


def samples_late(items: list[BatchItem]) -> bool:
    """The sampling rule of a step launched behind another: a constrained row's mask needs the token
    the step in flight samples, which the host reads only after this launch. Such a step runs its
    forward now and samples once that token has advanced the matchers, so the device computes the
    forward while the host reads the step before and fills the masks; only the sampling waits."""
    return any(it.req.grammar is not None for it in items)
