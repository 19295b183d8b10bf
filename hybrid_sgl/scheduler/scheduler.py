"""Continuous batching with chunked prefill, admission control and preemption.

Each step runs either an EXTEND batch (prompt chunks, up to `chunked_prefill_size` tokens)
or a DECODE batch (one token for every decoding request). Extend work goes first, but when
requests are decoding, steps alternate so a long prompt delays them by at most one chunk.
Pages are taken as tokens arrive; when they run out, the newest running request is preempted
(slot and pages released, tokens kept) and recomputed later, so the oldest always progresses.

The scheduler decides what runs; its pipeline decides how a step runs: to its end (pipeline.py),
with decode steps overlapped (overlap.py; the next one is the batch `_follow_up` builds from the
step in flight), or as verify steps of drafts (speculative.py). The prefix cache is reached through
its sharing interface (sharing.py), whose null object stands in when the cache is off.

A constrained request (regex, JSON schema, EBNF) waits in `compiling` (grammar_queue.py) until its
grammar has compiled, then queues like any other. Each sampled token advances its matcher; the
grammar's end finishes it with "stop".
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable

from hybrid_sgl.batch import ForwardMode
from hybrid_sgl.constrained import GrammarCache
from hybrid_sgl.memory.allocator import Allocator
from hybrid_sgl.runner.model_runner import BatchItem, ModelRunner
from hybrid_sgl.scheduler.grammar_queue import CompilingQueue
from hybrid_sgl.scheduler.overlap import OverlapPipeline
from hybrid_sgl.scheduler.pipeline import PlainPipeline, StepPipeline
from hybrid_sgl.scheduler.request import Req, ReqStatus
from hybrid_sgl.scheduler.results import ResultApplier
from hybrid_sgl.scheduler.sharing import BasePrefixSharing, NoPrefixSharing
from hybrid_sgl.scheduler.speculative import SpecPipeline

logger = logging.getLogger(__name__)


class AdmissionError(ValueError):
    """The request can never run on this server (too long, bad token ids)."""


class Scheduler:
    def __init__(self, runner: ModelRunner, *, allocator: Allocator, chunked_prefill_size: int,
                 stop_string_checker: Callable[[Req], str | None] | None = None, overlap: bool = False,
                 grammars: GrammarCache | None = None, sharing: BasePrefixSharing | None = None):
        """allocator: the pools' (memory/pools.py); sharing: the prefix cache's use (NoPrefixSharing if not given)."""
        self.runner = runner
        self.allocator = allocator
        self.context_length = runner.context_length
        self.vocab_size = runner.config.vocab_size
        self.chunk = chunked_prefill_size if chunked_prefill_size > 0 else self.context_length
        self.results = ResultApplier(eos_ids=runner.config.eos_token_ids, context_length=self.context_length,
                                     stop_string_checker=stop_string_checker)
        self.waiting: deque[Req] = deque()
        self.running: list[Req] = []
        self.last_was_extend = False
        self.num_preemptions = 0
        self._arrivals = itertools.count()
        self.grammars = grammars
        self.sharing = sharing if sharing is not None else NoPrefixSharing(allocator)
        self.pipeline: StepPipeline = (SpecPipeline(runner, self, overlap=overlap)
                                       if getattr(runner, "speculative", None) is not None
                                       else OverlapPipeline(runner, self) if overlap else PlainPipeline(runner, self))
        self.compiling = CompilingQueue(grammars)
        self.on_batch: Callable[[ForwardMode, list[BatchItem]], None] = lambda mode, items: None  # step_log.py

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
        req.start_input_logprobs()
        if req.params.grammar_key is not None and req.grammar is None:
            self.compiling.add(req)
            return
        self.waiting.append(req)

    def abort(self, rid: str) -> Req | None:
        req = self.compiling.remove(rid)
        if req is not None:
            req.finish({"type": "abort", "message": "aborted", "status_code": None, "err_type": None})
            return req
        for req in list(self.waiting) + self.running:
            if req.rid == rid:
                self.release(req, cache=False)  # its slot may be in the step in flight: cache nothing
                req.finish({"type": "abort", "message": "aborted", "status_code": None, "err_type": None})
                return req
        return None

    def flush_cache(self) -> bool:
        """Empty the prefix cache; refused (False) while requests run or wait, as in SGLang."""
        if self.has_work:
            return False
        self.sharing.flush()
        return True

    def cache_stats(self) -> dict:
        """Prefix-cache figures for /server_info and /metrics (zeros when it is off)."""
        return {**self.sharing.stats(), "computed_prompt_tokens": self.pipeline.computed_prompt_tokens,
                "avg_spec_accept_length": self.pipeline.accept_length}

    def check_integrity(self) -> None:
        """The allocator's and the prefix cache's invariants, counting the cache's references."""
        self.sharing.check_integrity(self.running + self.pipeline.holders())

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.pipeline.in_flight is not None or self.compiling)

    @property
    def num_overlapped_steps(self) -> int:
        return self.pipeline.num_overlapped_steps

    # ---- one step --------------------------------------------------------------------------------
    def step(self) -> list[Req]:
        """Run one batch. Returns the requests that got a token or finished."""
        failed = []
        if self.compiling:
            idle = not (self.waiting or self.running or self.pipeline.in_flight is not None)
            ready, failed = self.compiling.take_ready(idle=idle)
            self.waiting.extend(ready)
        return failed + self._step()

    def _step(self) -> list[Req]:
        in_flight = self.pipeline.in_flight
        if in_flight is not None:
            follow = self._follow_up(in_flight)
            if follow is not None:
                self.on_batch(ForwardMode.DECODE, follow[0])
            return self.pipeline.advance(follow)
        mode, items = self._schedule()
        if not items:
            return []
        self.last_was_extend = mode is ForwardMode.EXTEND
        self.on_batch(mode, items)
        return self.pipeline.run(mode, items)

    def drop_in_flight(self) -> None:
        """After a failed step: forget the step in flight and free the slots it was holding."""
        self.pipeline.drop_in_flight()

    def _follow_up(self, in_flight: list[BatchItem]) -> tuple[list[BatchItem], list[int]] | None:
        """The next decode batch, built before the tokens of the step in flight are known: its
        requests go on unless they stop by length there. Returns the items and, for each, its row in
        the step in flight. None when the next step needs those tokens first (prompt work or arrivals
        waiting, a decoding request outside the step, too few pages even after evicting cached
        prefixes)."""
        if self.waiting or any(r.status is ReqStatus.RUNNING and not r.is_decoding for r in self.running):
            return None
        items, rows, pages = [], [], 0
        n = self.pipeline.follow_tokens()
        for j, it in enumerate(in_flight):
            req = it.req
            if req.status is not ReqStatus.RUNNING:
                continue  # aborted while in flight
            start = req.num_computed + n  # where the row may start: at most n tokens past the one in flight
            # (a row the step in flight ends by length for sure stops here)
            if len(req.output_ids) + 1 >= req.params.max_new_tokens or start + n >= self.context_length:
                continue
            items.append(BatchItem(req=req, start=start, end=start + n, sample=True))
            rows.append(j)
            pages += self.allocator.extra_pages_needed(req.slot, start + n)
        stepping = {id(it.req) for it in in_flight}
        if (not items or any(r.is_decoding and id(r) not in stepping for r in self.running)
                or not self.pipeline.takes_follow_up(items)):
            return None
        # unused cached prefixes may go now: no request in flight holds them, and the step in flight is
        # queued before any write into a page handed on here
        if not self.sharing.ensure_free_pages(pages):
            return None  # would need preemption: decide it with the tokens in hand
        for it in items:
            self.allocator.grow(it.req.slot, it.end)
        return items, rows

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
            end = req.num_computed + min(req.remaining, budget)
            if not self._make_room(req, end):
                continue
            items.append(self._item(req, end - req.num_computed))
            budget -= end - req.num_computed
        self._admit_waiting(budget, items)
        return items

    def _admit_waiting(self, budget: int, items: list[BatchItem]) -> None:
        """Admit waiting requests while the budget, slots and pages allow; with the prefix cache each
        starts from its longest cached prefix (or waits for a running request computing it)."""
        if budget == 0 or self.allocator.num_free_slots == 0 or not self.waiting:
            return  # nothing can be admitted: spare the lookups of the ordering
        sharing, a = self.sharing, self.allocator
        prefilling = [r for r in self.running if not r.is_decoding]
        for req in sharing.order(self.waiting):
            if budget == 0 or a.num_free_slots == 0:
                break
            match = sharing.lookup(req)
            start = match.pos
            if sharing.held_back(req, start, prefilling):
                continue
            sharing.plan_branch(req, match)
            end = start + min(req.seq_len - start, budget)
            sharing.lock(match)
            headroom = len(self.running)  # one page of growth per running request
            if not sharing.ensure_free_pages(a.pages_for(end) - start // a.page_size + headroom):
                sharing.unlock(match)
                break
            self.waiting.remove(req)
            req.slot = a.alloc_slot()
            req.status = ReqStatus.RUNNING
            sharing.admit(req, match, req.slot)
            a.grow(req.slot, end)
            self.running.append(req)
            prefilling.append(req)
            items.append(self._item(req, end - start))
            budget -= end - start

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
        while not self.sharing.ensure_free_pages(need):
            newer = [r for r in self.running if r.arrival > req.arrival]
            victim = max(newer, key=lambda r: r.arrival) if newer else req
            self._preempt(victim)
            if victim is req:
                return False
        self.allocator.grow(req.slot, num_tokens)
        return True

    def free_slot(self, req: Req, cached: int | None) -> None:
        """Free req's slot; with `cached`, the slot's state is after fill_ids[:cached] and that prefix
        goes into the prefix cache first."""
        self.sharing.cache_sequence(req, cached)
        self.allocator.free_slot(req.slot)
        req.slot = None

    def _preempt(self, req: Req) -> None:
        logger.debug("preempting %s at %d tokens", req.rid, req.seq_len)
        self.release(req)
        req.status = ReqStatus.WAITING
        req.num_computed = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.append(req)
        self.waiting = deque(sorted(self.waiting, key=lambda r: r.arrival))

    def release(self, req: Req, free_slot: bool = True, cache: bool = True) -> None:
        """Take req out of the queues. free_slot: give its slot and pages back now (else the caller
        frees them later with free_slot); cache: first put its computed tokens into the prefix cache."""
        self.sharing.drop_lock(req)
        if req.slot is not None and free_slot:
            self.free_slot(req, req.num_computed if cache else None)
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
