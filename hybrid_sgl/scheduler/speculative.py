"""The speculative pipeline: every step runs to its end, as in the plain pipeline, and every decode
step is a verify step of the drafts its requests carry (runner/speculative.py). After each step the
MTP layer takes the step's new entries and proposes the next drafts.

While the runner's disable_batch_size requests or more are running or waiting (decoding, prefilling, queued), decode
steps take no drafts: each is a plain decode step, overlapped as in overlap.py (unless overlap is off).
The first decode step under the limit runs after the one in flight is read, as a verify step whose rows
carry no drafts yet, and drafting resumes from its tokens.

A verify row's tokens are applied one at a time through the scheduler's result rules, so stop
tokens, stop strings and max_new_tokens end it exactly where plain decoding would; the slot's state
then goes back to the state after the tokens kept. Pages for the next verify (the token and its
drafts) are taken when the drafts are made, evicting cached prefixes if needed, else no drafts.

Chained iterations (the default; off: --disable-speculative-overlap; runner/spec_chain.py): a decode batch whose rows
all chain (SpecChain.takes) and carry k drafts runs verify, accept, rollback and drafting on the device
as one iteration, and the scheduler launches the next iteration behind it (Scheduler._follow_up, each
row up to k + 1 tokens further, pages for that) before the host reads and applies this one, as
overlapped decode steps do. The device ends a row where the result rules end its request by a stop
token or by length, so the iterations behind leave its state alone (it runs there as a pad row) and it
goes into the prefix cache as after any step. A request that ends by a stop string keeps fewer tokens
than the device did: if the next iteration holds it, its slot is freed after that one without caching
its state; else its state goes back to its last kept token first (with --speculative-rollback replay
the draft rows hold no gated-delta-rule state, and it caches nothing). A row that leaves the run of
iterations takes its drafts back to the host for its next verify step.
"""

from __future__ import annotations

from hybrid_sgl.batch import ForwardMode
from hybrid_sgl.runner.model_runner import BatchItem, ModelRunner
from hybrid_sgl.runner.spec_chain import PendingChain, SpecChain
from hybrid_sgl.runner.speculative import DraftEntries, SpecDecoder
from hybrid_sgl.runner.step_results import ItemResult
from hybrid_sgl.scheduler.overlap import OverlapPipeline
from hybrid_sgl.scheduler.pipeline import StepHost
from hybrid_sgl.scheduler.request import Req, ReqStatus


class SpecPipeline(OverlapPipeline):
    def __init__(self, runner: ModelRunner, host: StepHost, overlap: bool = True):
        super().__init__(runner, host)
        self.spec: SpecDecoder = runner.speculative
        self.overlap = overlap
        self.plain_decode_steps = 0  # decode steps without drafts, run as the batch reached disable_batch_size
        self.chain: SpecChain | None = self.spec.chain  # (None: ServerArgs.chains_verify_steps is off)
        self._chain: PendingChain | None = None  # the chained iteration in flight

    @property
    def accept_length(self) -> float:
        return self.spec.accept_length

    def run(self, mode: ForwardMode, items: list[BatchItem]) -> list[Req]:
        if mode is ForwardMode.EXTEND:
            changed = self.run_to_end(mode, items)
            drafting = self._speculating()  # drafts for the next decode step, unless the batch is too large
            entries, offset = [], 0
            for it in items:
                req = it.req
                if req.status is ReqStatus.RUNNING:
                    n = min(it.end, req.seq_len - 1) - it.start  # entries whose next token is known
                    if n > 0:
                        entries.append(DraftEntries(req=req, start=it.start, tokens=req.token_slice(it.start + 1,
                                                    it.start + 1 + n), hidden_rows=list(range(offset, offset + n)),
                                                    want=self.spec.budget(req) if drafting and req.is_decoding else 0))
                offset += it.end - it.start
            self._draft(entries)
            return changed
        if self._speculating():
            if self._starts_chain(items):
                drafts = [self._chain_drafts(it) for it in items]
                for it in items:
                    it.req.spec_drafts, it.req.spec_base = [], -1
                self._chain = self.chain.launch(items, drafts=drafts)
                return []
            return self._verify(items)
        self.plain_decode_steps += 1
        for it in items:  # drafts made for this step go unused
            it.req.spec_drafts, it.req.spec_base = [], -1
        return super().run(mode, items) if self.overlap else self.run_to_end(mode, items)

    def _speculating(self) -> bool:
        """Whether the decode batch is small enough to speculate. It counts every request that is or will
        soon be in it: decoding, prefilling, and waiting (up to --max-running-requests), so that a batch
        filling up by chunked prefill decodes plain steps from its start, as it would without drafts."""
        host = self.host
        return self.spec.speculates(min(len(host.running) + len(host.waiting), self.runner.plan.max_running_requests))

    def _starts_chain(self, items: list[BatchItem]) -> bool:
        """Whether a verify step may run as chained iterations: every row chains, its k + 1 tokens fit the
        context, and the pages for them are there (evicting cached prefixes if needed). The device ends each row
        at max_new_tokens, so a row near it chains as well."""
        k = self.spec.k
        return (self.chain is not None and self.chain.takes(items)
                and all(it.start + k + 1 <= self.runner.context_length for it in items)
                and all(self._pages_for_drafts(it.req, k) for it in items))

    def _chain_drafts(self, it: BatchItem) -> list[int]:
        """The k drafts of a row that starts a chain: those made for it, filled up with its own token (a filler
        is verified like any draft: kept only where it is the model's token)."""
        req, k = it.req, self.spec.k
        drafts = req.spec_drafts[:k] if req.spec_base == it.start else []
        return drafts + req.token_slice(it.start, it.end) * (k - len(drafts))

    @property
    def in_flight(self) -> list[BatchItem] | None:
        return self._chain.items if self._chain is not None else super().in_flight

    def holders(self) -> list[Req]:
        return [req for req, _ in self._chain.deferred] if self._chain is not None else super().holders()

    def follow_tokens(self) -> int:
        return self.spec.k + 1 if self._chain is not None else 1

    def takes_follow_up(self, items: list[BatchItem]) -> bool:
        """Behind a chained iteration: another while the batch still chains and speculates. Behind a plain
        decode step: another while the batch is as large as the limit."""
        if self._chain is not None:
            return self.chain.takes(items) and self.spec.speculates(len(items))
        return not self.spec.speculates(len(items))

    def advance(self, follow: tuple[list[BatchItem], list[int]] | None) -> list[Req]:
        if self._chain is None:
            self.plain_decode_steps += follow is not None
            return super().advance(follow)
        pending, self._chain = self._chain, None
        if follow is not None:
            items, rows = follow
            self._chain = self.chain.launch(items, pending, rows)
            self.num_overlapped_steps += 1
        return self._resolve_chain(pending)

    def drop_in_flight(self) -> None:
        if self._chain is not None:
            for req, _ in self._chain.deferred:
                self.host.free_slot(req, None)
            self._chain = None
        super().drop_in_flight()

    def _resolve_chain(self, pending: PendingChain) -> list[Req]:
        """Wait for a chained iteration and apply each row's tokens (as _verify does). A request that finished
        where the device ended its row too (a stop token, max_new_tokens, the context) has its slot's state after
        its own tokens: if the iteration now in flight holds it (as a pad row), its slot is freed and cached after
        that one. One that finished where the device did not (a stop string) goes back to the state after its
        last applied token, or caches nothing if the iteration in flight holds it. A running row that leaves the
        run of iterations takes its drafts to the host for its next verify step."""
        host, spec = self.host, self.spec
        try:
            results = pending.results()
        except BaseException:
            for req, _ in pending.deferred:
                host.free_slot(req, None)
            raise
        for req, cached in pending.deferred:  # the iteration that held their slots is over
            host.free_slot(req, cached)
        held = {id(it.req) for it in self._chain.items} if self._chain is not None else set()
        changed, copies, ending = [], [], []
        for it, (tokens, drafts) in zip(pending.items, results):
            req = it.req
            if req.status is not ReqStatus.RUNNING:
                continue  # aborted while in flight
            assert tokens, f"the device ended {req.rid}'s row where the host's result rules did not end it"
            applied = self._apply_row(req, [ItemResult(next_token=t) for t in tokens])
            spec.verified_rows += 1
            spec.verified_tokens += applied
            changed.append(req)
            if req.finished:
                if id(req) in held:
                    host.release(req, free_slot=False)
                    self._chain.deferred.append((req, req.num_computed if applied == len(tokens) and _ended_on_device(
                        req) else None))
                    continue
                if applied < len(tokens):  # the device kept more: back to the state after the applied ones
                    if spec.replay:  # (the draft rows hold no gated-delta-rule state: cache none)
                        host.release(req, cache=False)
                        continue
                    copies.append((self.runner.allocator.draft_rows(req.slot)[applied - 1], req.slot))
                ending.append(req)
            elif id(req) not in held:  # not in the next iteration: its drafts go to the host
                ending.append(req)
                req.spec_drafts, req.spec_base = drafts, req.num_computed
        if copies:
            src, dst = zip(*copies)
            self.runner.state_pool.copy_slots(list(src), list(dst))
        for req in ending:
            if req.finished:
                host.release(req)
            elif not self._pages_for_drafts(req, spec.budget(req)):
                req.spec_drafts, req.spec_base = [], -1
        return changed

    def _verify(self, items: list[BatchItem]) -> list[Req]:
        host, spec = self.host, self.spec
        drafts = []
        for it in items:
            req = it.req
            drafts.append(req.spec_drafts[:spec.budget(req)] if req.spec_base == it.start else [])
            req.spec_drafts, req.spec_base = [], -1
        rows = spec.verify(items, drafts)  # (cuts a constrained row's drafts in `drafts` where its grammar stops them)
        changed, entries, offset = [], [], 0
        for it, draft, row in zip(items, drafts, rows):
            req, start = it.req, it.start
            if draft:
                kept = self._apply_row(req, row)
                spec.keep(req, 1 + len(draft), kept)
                changed.append(req)
            else:
                kept = 1
                if host.results.apply(it, row[0]):
                    changed.append(req)
            if not req.finished and spec.budget(req) > 0:
                entries.append(DraftEntries(req=req, start=start, tokens=req.token_slice(start + 1, start + 1 + kept),
                                            hidden_rows=list(range(offset, offset + kept)), want=spec.budget(req)))
            offset += 1 + len(draft)
        spec.roll_back()  # before a finished request's slot goes to the prefix cache
        for req in changed:
            if req.finished:
                host.release(req)
        self._draft(entries)
        return changed

    def _apply_row(self, req: Req, results: list[ItemResult]) -> int:
        """Apply a verify row's results to req one token at a time through the result rules, up to where they
        end it (a stop, max_new_tokens): plain decoding's tokens and finish. Returns the tokens applied."""
        start, applied = req.num_computed, 0
        req.spec_verify_ct += 1
        for result in results:
            self.host.results.apply(BatchItem(req=req, start=start + applied, end=start + applied + 1, sample=True),
                                    result)
            applied += 1
            if req.finished:
                break
        return applied

    def _draft(self, entries: list[DraftEntries]) -> None:
        """Propose the entries' drafts, each with pages up to its verify row's last token."""
        for e in entries:
            if e.want and not self._pages_for_drafts(e.req, e.want):
                e.want = 0
        for e, draft in zip(entries, self.spec.draft(entries)):
            if e.want:
                e.req.spec_drafts, e.req.spec_base = draft, e.req.num_computed

    def _pages_for_drafts(self, req: Req, want: int) -> bool:
        """Pages for req's next verify row (its token and `want` drafts), evicting cached prefixes if needed."""
        a, need = self.runner.allocator, req.num_computed + want + 1
        if not self.host.sharing.ensure_free_pages(a.extra_pages_needed(req.slot, need)):
            return False
        a.grow(req.slot, need)
        return True


def _ended_on_device(req: Req) -> bool:
    """Whether the device ended req's row where the host finished it (SpecChain._end_rows): by a stop token or
    by length, not by a stop string or regex."""
    reason = req.finish_reason or {}
    return reason.get("type") == "length" or (reason.get("type") == "stop" and isinstance(reason.get("matched"), int))
