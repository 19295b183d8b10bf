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
"""

from __future__ import annotations

from hybrid_sgl.batch import ForwardMode
from hybrid_sgl.runner.model_runner import BatchItem, ModelRunner
from hybrid_sgl.runner.speculative import DraftEntries, SpecDecoder
from hybrid_sgl.scheduler.overlap import OverlapPipeline
from hybrid_sgl.scheduler.pipeline import StepHost
from hybrid_sgl.scheduler.request import Req, ReqStatus


class SpecPipeline(OverlapPipeline):
    def __init__(self, runner: ModelRunner, host: StepHost, overlap: bool = True):
        super().__init__(runner, host)
        self.spec: SpecDecoder = runner.speculative
        self.overlap = overlap
        self.plain_decode_steps = 0  # decode steps without drafts, run as the batch reached disable_batch_size

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

    def takes_follow_up(self, items: list[BatchItem]) -> bool:
        """A follow-up of the plain decode step in flight goes behind it while it is as large as the limit."""
        return not self.spec.speculates(len(items))

    def advance(self, follow: tuple[list[BatchItem], list[int]] | None) -> list[Req]:
        self.plain_decode_steps += follow is not None
        return super().advance(follow)

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
                req.spec_verify_ct += 1
                kept = 0
                for result in row:
                    host.results.apply(BatchItem(req=req, start=start + kept, end=start + kept + 1, sample=True),
                                       result)
                    kept += 1
                    if req.finished:
                        break
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

    def _draft(self, entries: list[DraftEntries]) -> None:
        """Propose the entries' drafts, each with pages up to its verify row's last token."""
        a = self.runner.allocator
        for e in entries:
            if e.want:
                need = e.req.num_computed + e.want + 1
                if self.host.sharing.ensure_free_pages(a.extra_pages_needed(e.req.slot, need)):
                    a.grow(e.req.slot, need)
                else:
                    e.want = 0
        for e, draft in zip(entries, self.spec.draft(entries)):
            if e.want:
                e.req.spec_drafts, e.req.spec_base = draft, e.req.num_computed
