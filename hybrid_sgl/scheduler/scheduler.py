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

A constrained request (regex, JSON schema, EBNF) waits in `compiling` (grammar_queue.py) until its
grammar has compiled, then queues like any other. Each sampled token advances its matcher; the
grammar's end finishes it with "stop". Overlapped steps with grammars sample late: see
ModelRunner.launch_decode.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable

from hybrid_sgl.batch import ForwardMode
from hybrid_sgl.constrained import GrammarCache
from hybrid_sgl.constrained.stop_regex import find_stop_regex
from hybrid_sgl.memory.allocator import Allocator
from hybrid_sgl.runner.model_runner import BatchItem, ItemResult, ModelRunner, PendingDecode
from hybrid_sgl.scheduler.grammar_queue import CompilingQueue
from hybrid_sgl.scheduler.prefix_sharing import PrefixSharing
from hybrid_sgl.scheduler.request import Req, ReqStatus

logger = logging.getLogger(__name__)


class AdmissionError(ValueError):
    """The request can never run on this server (too long, bad token ids)."""


class Scheduler:
    def __init__(self, runner: ModelRunner, *, chunked_prefill_size: int,
                 stop_string_checker: Callable[[Req], str | None] | None = None, overlap: bool = False,
                 grammars: GrammarCache | None = None, sharing: PrefixSharing | None = None):
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
        self.grammars = grammars
        self.sharing = sharing  # the prefix cache's use; None with --disable-radix-cache
        self.computed_prompt_tokens = 0  # tokens run through extend steps (prompts and recomputes)
        self.compiling = CompilingQueue(grammars)

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
            req.input_token_ids_logprobs.append(None)
            req.input_logprob_pos = 1
        else:
            req.input_logprob_pos = req.logprob_start_len
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
                self._release(req, cache=False)  # its slot may be in the step in flight: cache nothing
                req.finish({"type": "abort", "message": "aborted", "status_code": None, "err_type": None})
                return req
        return None

    def flush_cache(self) -> bool:
        """Empty the prefix cache; refused (False) while requests run or wait, as in SGLang."""
        if self.has_work:
            return False
        if self.sharing is not None:
            self.sharing.cache.flush()
        return True

    def cache_stats(self) -> dict:
        """Prefix-cache figures for /server_info and /metrics (zeros when it is off)."""
        if self.sharing is None:
            return {"cached_pages": 0, "evictable_pages": 0, "num_snapshots": 0, "snapshot_slots": 0,
                    "cache_nodes": 0, "cache_hit_tokens": 0, "cache_lookup_tokens": 0,
                    "computed_prompt_tokens": self.computed_prompt_tokens}
        return {**self.sharing.cache.stats(), "computed_prompt_tokens": self.computed_prompt_tokens}

    def check_integrity(self) -> None:
        """The allocator's and the prefix cache's invariants, counting the cache's references."""
        if self.sharing is None:
            self.allocator.check_integrity()
            return
        holders = list(self.running) + (list(self._pending.deferred) if self._pending is not None else [])
        self.sharing.check_integrity(holders)
        cache = self.sharing.cache
        self.allocator.check_integrity(cache_pages=cache.held_pages(), cache_snapshots=cache.held_snapshots())

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._pending or self.compiling)

    # ---- one step --------------------------------------------------------------------------------
    def step(self) -> list[Req]:
        """Run one batch. Returns the requests that got a token or finished."""
        failed = []
        if self.compiling:
            ready, failed = self.compiling.take_ready(idle=not (self.waiting or self.running or self._pending))
            self.waiting.extend(ready)
        return failed + self._step()

    def _step(self) -> list[Req]:
        if self._pending is not None:
            return self._step_after_pending()
        mode, items = self._schedule()
        if not items:
            return []
        self.last_was_extend = mode is ForwardMode.EXTEND
        if self.overlap and mode is ForwardMode.DECODE and self.runner.can_overlap(items):
            self._pending = self.runner.launch_decode(items)
            return []
        sharing = self.sharing if mode is ForwardMode.EXTEND else None
        if sharing is not None:
            sharing.plan_snapshots(items, self.waiting)
        try:
            results = self.runner.run(mode, items)
        except BaseException:
            if sharing is not None:
                sharing.drop_snapshots(items)
            raise
        if mode is ForwardMode.EXTEND:
            self.computed_prompt_tokens += sum(it.end - it.start for it in items)
        changed = []
        for item, result in zip(items, results):
            if self._apply(item, result):
                changed.append(item.req)
        if sharing is not None:  # the snapshots taken inside the chunks go into the cache
            for item in items:
                sharing.snapshots_done(item)
        for req in changed:
            if req.finished:
                self._release(req)
        if sharing is not None:  # so do the chunks' prefixes and end states (a finished request's: above)
            for item in items:
                if item.req.status is ReqStatus.RUNNING:
                    sharing.chunk_done(item.req)
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
        changed = self._resolve(pending)
        if launched is not None and any(it.req.grammar is not None for it in launched.items):
            self.runner.sample_pending(launched)  # launched unsampled: its masks needed pending's tokens
        return changed

    def drop_in_flight(self) -> None:
        """After a failed step: forget the step in flight and free the slots it was holding."""
        if self._pending is not None:
            for req in self._pending.deferred:
                self._free_slot(req, None)
            self._pending = None

    def _follow_up(self, pending: PendingDecode) -> tuple[list[BatchItem], list[int]] | None:
        """The next decode batch, built before `pending`'s tokens are known: its requests go on
        unless they stop by length at `pending`. None when the next step needs the host's answer
        first (prompt work or arrivals waiting, a decoding request outside `pending`, too few pages even after
        evicting cached prefixes)."""
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
        # unused cached prefixes may go now: no request in flight holds them, and the step in flight is
        # queued before any write into a page handed on here
        if not self._ensure_free_pages(pages):
            return None  # would need preemption: decide it with the tokens in hand
        for it in items:
            self.allocator.grow(it.req.slot, it.end)
        return items, rows

    def _resolve(self, pending: PendingDecode) -> list[Req]:
        """Wait for `pending`, apply its tokens; a request that finishes while it is also in the step
        now in flight keeps its slot until that step is read."""
        try:
            results = pending.results()
        except BaseException:  # the step is over all the same: the slots it held are free
            for req in pending.deferred:
                self._free_slot(req, None)
            raise
        for req in pending.deferred:  # this step fed their last token: the state is after all of fill_ids
            self._free_slot(req, req.num_computed + 1)
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
        sharing = self.sharing
        prefilling = [r for r in self.running if not r.is_decoding]
        for req in (sharing.order(self.waiting) if sharing is not None else list(self.waiting)):
            if budget == 0 or self.allocator.num_free_slots == 0:
                break
            match = sharing.lookup(req) if sharing is not None else None
            start = match.pos if match is not None else 0
            if sharing is not None:
                if sharing.held_back(req, start, prefilling):
                    continue
                sharing.plan_branch(req, match)
            end = start + min(req.seq_len - start, budget)
            if sharing is not None:
                sharing.lock(match)
            headroom = len(self.running)  # one page of growth per running request
            if not self._ensure_free_pages(self.allocator.pages_for(end) - start // self.allocator.page_size
                                           + headroom):
                if sharing is not None:
                    sharing.unlock(match)
                break
            self.waiting.remove(req)
            req.slot = self.allocator.alloc_slot()
            req.status = ReqStatus.RUNNING
            if sharing is not None:
                sharing.admit(req, match, req.slot)
            self.allocator.grow(req.slot, end)
            self.running.append(req)
            prefilling.append(req)
            items.append(self._item(req, end - start))
            budget -= end - start

    def _ensure_free_pages(self, n: int) -> bool:
        """Whether n pages are free, after evicting unused cached prefixes if needed."""
        if self.sharing is not None:
            return self.sharing.ensure_free_pages(n)
        return self.allocator.num_free_pages >= n

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
        while not self._ensure_free_pages(need):
            newer = [r for r in self.running if r.arrival > req.arrival]
            victim = max(newer, key=lambda r: r.arrival) if newer else req
            self._preempt(victim)
            if victim is req:
                return False
        self.allocator.grow(req.slot, num_tokens)
        return True

    def _free_slot(self, req: Req, cached: int | None) -> None:
        """Free req's slot; with `cached`, the slot's state is after fill_ids[:cached] and that prefix
        goes into the prefix cache first."""
        if self.sharing is not None and cached is not None and req.slot is not None:
            self.sharing.cache_sequence(req, cached)
        self.allocator.free_slot(req.slot)
        req.slot = None

    def _preempt(self, req: Req) -> None:
        logger.debug("preempting %s at %d tokens", req.rid, req.seq_len)
        self._release(req)
        req.status = ReqStatus.WAITING
        req.num_computed = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.append(req)
        self.waiting = deque(sorted(self.waiting, key=lambda r: r.arrival))

    def _release(self, req: Req, free_slot: bool = True, cache: bool = True) -> None:
        """Take req out of the queues. free_slot: give its slot and pages back now (else the caller
        frees them later with _free_slot); cache: first put its computed tokens into the prefix cache."""
        if self.sharing is not None:
            self.sharing.drop_lock(req)
        if req.slot is not None and free_slot:
            self._free_slot(req, req.num_computed if cache else None)
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
        req.input_token_ids_logprobs += result.input_token_ids_logprobs
        if result.next_token is None:
            if item.end == req.seq_len and len(req.output_ids) >= req.params.max_new_tokens:
                req.finish({"type": "length", "length": req.params.max_new_tokens})  # prefill only
                return True
            return False
        token = result.next_token
        req.output_ids.append(token)
        if req.grammar is not None and not req.grammar.accept(token):
            req.finish({"type": "abort", "message": f"the sampled token {token} does not fit the grammar "
                        "(min_new_tokens may forbid the only tokens it allows)", "status_code": None,
                        "err_type": None})
            return True
        if req.return_logprob:
            req.output_token_logprobs.append((result.token_logprob, token))
            req.output_top_logprobs.append(result.top_logprobs)
            if req.token_ids_logprob:
                req.output_token_ids_logprobs.append(result.token_ids_logprobs or [])
        self._check_finished(req, token)
        return True

    def _check_finished(self, req: Req, token: int) -> None:
        p = req.params
        n_out = len(req.output_ids)
        if req.grammar is not None and req.grammar.is_terminated():
            req.finish({"type": "stop", "matched": token})
            return
        if n_out >= p.min_new_tokens:
            if (token in self.eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
                req.finish({"type": "stop", "matched": token})
                return
            if p.stop and self.stop_string_checker is not None:
                matched = self.stop_string_checker(req)
                if matched is not None:
                    req.finish({"type": "stop", "matched": matched})
                    return
            if p.stop_regex and self.stop_string_checker is not None:
                matched = find_stop_regex(self.stop_string_checker.tokenizer, req)
                if matched is not None:
                    req.finish({"type": "stop", "matched": matched})
                    return
        if n_out >= p.max_new_tokens:
            req.finish({"type": "length", "length": p.max_new_tokens})
        elif req.seq_len >= self.context_length:
            req.finish({"type": "length", "length": n_out})
