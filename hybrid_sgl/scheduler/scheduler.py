"""Continuous batching with chunked prefill, admission control and preemption.

Each step runs either an EXTEND batch (prompt chunks, up to `chunked_prefill_size` tokens)
or a DECODE batch (one token for every decoding request). Extend work goes first, but when
requests are decoding, steps alternate so a long prompt delays them by at most one chunk.
Pages are taken as tokens arrive; when they run out, the newest running request is preempted
(slot and pages released, tokens kept) and recomputed later, so the oldest always progresses.

Unless `disable_overlap_schedule` is set, a run of decode steps is pipelined: step N+1 is launched (its
input tokens are step N's samples, still on the device) before the host reads step N's tokens,
so the host's bookkeeping overlaps the device's work. A request that stops at step N (EOS, stop
token or string, abort) wastes its row of step N+1, which is discarded; its slot is freed only
after that step. Anything else (prompt work, new arrivals, memory pressure, logprobs) first
waits for the step in flight and then runs synchronously.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable

from hybrid_sgl.memory.allocator import Allocator
from hybrid_sgl.runner.forward_batch import ForwardMode
from hybrid_sgl.runner.model_runner import BatchItem, ItemResult, ModelRunner, PendingDecode
from hybrid_sgl.scheduler.request import Req, ReqStatus

logger = logging.getLogger(__name__)


class AdmissionError(ValueError):
    """The request can never run on this server (too long, bad token ids)."""


class Scheduler:
    def __init__(self, runner: ModelRunner, *, chunked_prefill_size: int,
                 stop_string_checker: Callable[[Req], str | None] | None = None, overlap: bool = False):
        self.runner = runner
        self.allocator: Allocator = runner.allocator
        self.context_length = runner.context_length
        self.vocab_size = runner.config.vocab_size
        self.eos_ids = set(runner.config.eos_token_ids)
        self.chunk = chunked_prefill_size if chunked_prefill_size > 0 else self.context_length
        self.stop_string_checker = stop_string_checker
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.last_was_extend = False
        self.num_preemptions = 0
        self._arrivals = itertools.count()
        self.overlap = overlap
        self._pending: PendingDecode | None = None
        self.num_overlapped_steps = 0

    # ---- requests in / out -----------------------------------------------------------------------
    def validate(self, prompt_ids: list[int], max_new_tokens: int) -> None:
        """Raise AdmissionError if a request with this prompt could never run here."""
        n = len(prompt_ids)
        if n == 0:
            raise AdmissionError("the prompt is empty")
        bad = [t for t in prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise AdmissionError(f"token id {bad[0]} is outside the vocabulary [0, {self.vocab_size})")
        if n >= self.context_length:
            raise AdmissionError(f"the prompt has {n} tokens; the context length is {self.context_length}")
        if n + max_new_tokens > self.context_length:
            raise AdmissionError(f"the prompt has {n} tokens and max_new_tokens is {max_new_tokens}: "
                                 f"{n + max_new_tokens} exceeds the context length {self.context_length}")

    def add(self, req: Req) -> None:
        self.validate(req.prompt_ids, req.params.max_new_tokens)
        req.arrival = next(self._arrivals)
        if req.return_logprob and req.logprob_start_len == 0:
            req.input_token_logprobs.append((None, req.prompt_ids[0]))
            req.input_top_logprobs.append(None)
            req.input_logprob_pos = 1
        else:
            req.input_logprob_pos = req.logprob_start_len
        self.waiting.append(req)

    def abort(self, rid: str) -> Req | None:
        for req in list(self.waiting) + self.running:
            if req.rid == rid:
                self._release(req)
                req.finish({"type": "abort", "message": "aborted", "status_code": None, "err_type": None})
                return req
        return None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._pending)

    # ---- one step --------------------------------------------------------------------------------
    def step(self) -> list[Req]:
        """Run one batch. Returns the requests that got a token or finished."""
        if self._pending is not None:
            return self._step_after_pending()
        mode, items = self._schedule()
        if not items:
            return []
        self.last_was_extend = mode is ForwardMode.EXTEND
        if self.overlap and mode is ForwardMode.DECODE and self.runner.can_overlap(items):
            self._pending = self.runner.launch_decode(items)
            return []
        results = self.runner.run(mode, items)
        changed = []
        for item, result in zip(items, results):
            if self._apply(item, result):
                changed.append(item.req)
        for req in changed:
            if req.finished:
                self._release(req)
        return changed

    # ---- overlapped decode -----------------------------------------------------------------------
    def _step_after_pending(self) -> list[Req]:
        """Launch the follow-up decode step if one can run blind, then read the step in flight."""
        pending, follow, launched = self._pending, self._follow_up(self._pending), None
        if follow is not None:
            items, rows = follow
            launched = self.runner.launch_decode(items, prev=pending, prev_rows=rows)
            self.num_overlapped_steps += 1
        self._pending = launched
        return self._resolve(pending)

    def drop_in_flight(self) -> None:
        """After a failed step: forget the step in flight and free the slots it was holding."""
        if self._pending is not None:
            for req in self._pending.deferred:
                self.allocator.free_slot(req.slot)
                req.slot = None
            self._pending = None

    def _follow_up(self, pending: PendingDecode) -> tuple[list[BatchItem], list[int]] | None:
        """The next decode batch, built before `pending`'s tokens are known: its requests go on
        unless they stop by length at `pending`. None when the next step needs the host's answer
        first (prompt work or arrivals waiting, a decoding request outside `pending`, too few pages)."""
        if self.waiting or any(r.status is ReqStatus.RUNNING and not r.is_decoding for r in self.running):
            return None
        items, rows, pages = [], [], 0
        for j, it in enumerate(pending.items):
            req = it.req
            if req.status is not ReqStatus.RUNNING:
                continue  # aborted while in flight
            n_out = len(req.output_ids) + 1  # once pending's token is in
            if n_out >= req.params.max_new_tokens or req.seq_len + 1 >= self.context_length:
                continue
            items.append(BatchItem(req=req, start=it.end, end=it.end + 1, sample=True))
            rows.append(j)
            pages += self.allocator.extra_pages_needed(req.slot, it.end + 1)
        in_flight = {id(it.req) for it in pending.items}
        if not items or any(r.is_decoding and id(r) not in in_flight for r in self.running):
            return None
        if pages > self.allocator.num_free_pages:
            return None  # would need preemption: decide it with the tokens in hand
        for it in items:
            self.allocator.grow(it.req.slot, it.end)
        return items, rows

    def _resolve(self, pending: PendingDecode) -> list[Req]:
        """Wait for `pending`, apply its tokens; a request that finishes while it is also in the step
        now in flight keeps its slot until that step is read."""
        try:
            results = pending.results()
        finally:  # whatever happens, the step is over: the slots it held are free
            for req in pending.deferred:
                self.allocator.free_slot(req.slot)
                req.slot = None
        changed = []
        for item, result in zip(pending.items, results):
            if item.req.status is ReqStatus.RUNNING and self._apply(item, result):
                changed.append(item.req)
        next_reqs = {id(it.req) for it in self._pending.items} if self._pending is not None else set()
        for req in changed:
            if req.finished:
                if id(req) in next_reqs:
                    self._release(req, free_slot=False)
                    self._pending.deferred.append(req)
                else:
                    self._release(req)
        return changed

    def _schedule(self) -> tuple[ForwardMode, list[BatchItem]]:
        decoding = any(r.is_decoding for r in self.running)
        if not (decoding and self.last_was_extend):
            items = self._schedule_extend()
            if items:
                return ForwardMode.EXTEND, items
        items = self._schedule_decode()
        if items:
            return ForwardMode.DECODE, items
        return ForwardMode.EXTEND, self._schedule_extend()

    def _schedule_extend(self) -> list[BatchItem]:
        budget, items = self.chunk, []
        for req in sorted((r for r in self.running if not r.is_decoding), key=lambda r: r.arrival):
            if budget == 0:
                break
            if req.status is not ReqStatus.RUNNING:  # preempted while making room for an older one
                continue
            n = min(req.remaining, budget)
            if not self._make_room(req, req.num_computed + n):
                continue
            items.append(self._item(req, n))
            budget -= n
        while self.waiting and budget > 0 and self.allocator.num_free_slots > 0:
            req = self.waiting[0]
            n = min(req.remaining, budget)
            headroom = len(self.running)  # one page of growth per running request
            if self.allocator.pages_for(n) + headroom > self.allocator.num_free_pages:
                break
            self.waiting.popleft()
            req.slot = self.allocator.alloc_slot()
            req.status = ReqStatus.RUNNING
            self.allocator.grow(req.slot, n)
            self.running.append(req)
            items.append(self._item(req, n))
            budget -= n
        return items

    def _schedule_decode(self) -> list[BatchItem]:
        items = []
        for req in sorted((r for r in self.running if r.is_decoding), key=lambda r: r.arrival):
            if req.status is not ReqStatus.RUNNING:
                continue
            if self._make_room(req, req.seq_len):  # victims are newer, so none is in items yet
                items.append(self._item(req, 1))
        return items

    def _item(self, req: Req, n: int) -> BatchItem:
        end = req.num_computed + n
        sample = end == req.seq_len and len(req.output_ids) < req.params.max_new_tokens
        return BatchItem(req=req, start=req.num_computed, end=end, sample=sample)

    # ---- memory pressure -------------------------------------------------------------------------
    def _make_room(self, req: Req, num_tokens: int) -> bool:
        """Give req pages for num_tokens, preempting newer requests if needed. False (and req
        preempted itself if it is the newest) when that is impossible."""
        need = self.allocator.extra_pages_needed(req.slot, num_tokens)
        while need > self.allocator.num_free_pages:
            newer = [r for r in self.running if r.arrival > req.arrival]
            victim = max(newer, key=lambda r: r.arrival) if newer else req
            self._preempt(victim)
            if victim is req:
                return False
        self.allocator.grow(req.slot, num_tokens)
        return True

    def _preempt(self, req: Req) -> None:
        logger.debug("preempting %s at %d tokens", req.rid, req.seq_len)
        self._release(req)
        req.status = ReqStatus.WAITING
        req.num_computed = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.append(req)
        self.waiting = deque(sorted(self.waiting, key=lambda r: r.arrival))

    def _release(self, req: Req, free_slot: bool = True) -> None:
        if req.slot is not None and free_slot:
            self.allocator.free_slot(req.slot)
            req.slot = None
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)

    # ---- results ---------------------------------------------------------------------------------
    def _apply(self, item: BatchItem, result: ItemResult) -> bool:
        req = item.req
        req.num_computed = item.end
        for pos, lp, top in result.input_logprobs:
            req.input_token_logprobs.append((lp, req.prompt_ids[pos]))
            req.input_top_logprobs.append(top)
            req.input_logprob_pos = pos + 1
        if result.next_token is None:
            if item.end == req.seq_len and len(req.output_ids) >= req.params.max_new_tokens:
                req.finish({"type": "length", "length": req.params.max_new_tokens})  # prefill only
                return True
            return False
        token = result.next_token
        req.output_ids.append(token)
        if req.return_logprob:
            req.output_token_logprobs.append((result.token_logprob, token))
            req.output_top_logprobs.append(result.top_logprobs)
        self._check_finished(req, token)
        return True

    def _check_finished(self, req: Req, token: int) -> None:
        p = req.params
        n_out = len(req.output_ids)
        if n_out >= p.min_new_tokens:
            if (token in self.eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
                req.finish({"type": "stop", "matched": token})
                return
            if p.stop and self.stop_string_checker is not None:
                matched = self.stop_string_checker(req)
                if matched is not None:
                    req.finish({"type": "stop", "matched": matched})
                    return
        if n_out >= p.max_new_tokens:
            req.finish({"type": "length", "length": p.max_new_tokens})
        elif req.seq_len >= self.context_length:
            req.finish({"type": "length", "length": n_out})
