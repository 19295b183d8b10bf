"""Speculative decoding with the model's own MTP layer (NEXTN): draft, verify, roll back.

A request that decodes greedily (and asks for nothing that reads the sampling distribution) carries
up to k draft tokens d1..dk, proposed by the MTP layer (models/mtp.py). Its next decode step is a
verify row of k + 1 tokens [x_L, d1..dk] at positions L..L+k in an extend-shaped step; the model's
own greedy token after each of them is t1..t(k+1). The drafts are accepted while d_i == t_i; the
request then gains d1..dj and t(j+1): j + 1 tokens for one step of the model, and exactly the tokens
plain greedy decoding gives.

Rollback: the verify step's recurrent kernels write the state after each of the first k tokens of
a row into the slot's k verify rows (snapshot cuts, ForwardBatch.snap_pos), and the slot holds the
state after all k + 1. Keeping m tokens copies row m - 1 into the slot (m = k + 1: nothing to do).
KV written past the kept tokens is overwritten before anything reads it. Other rows of the same step
(sampled, constrained, logprob requests) are one-token rows sampled as in any decode step.

Drafting: the MTP layer's entry i takes the token at i + 1 and the model's final hidden state at i.
After every step, each row's new entries (the prompt chunk's, or the kept tokens') run through it in
one extend pass, whose last entry proposes d1; d2..dk come from one-entry passes that feed the MTP
layer's own output back. Its KV sits in the KV pool as the layer after the model's, at the entries'
positions, so cached prefixes carry it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hybrid_sgl.batch import ForwardMode, StepPlan

if TYPE_CHECKING:
    from hybrid_sgl.runner.model_runner import BatchItem, ItemResult, ModelRunner
    from hybrid_sgl.scheduler.request import Req


def takes_drafts(req: Req) -> bool:
    """Whether req's tokens are the argmax of the model's logits alone, so that drafts can be checked
    against them: greedy, no grammar, bias, penalties, min_new_tokens or logprobs."""
    p = req.params
    return (p.greedy and p.grammar_key is None and not p.logit_bias and not p.uses_penalties
            and p.min_new_tokens == 0 and not req.return_logprob)


@dataclass
class DraftEntries:
    """New MTP entries of one request: positions start.., the tokens at start + 1.., and which rows of
    the step's final hidden states belong to them; want: the drafts to propose after them (0: none)."""

    req: Req
    start: int
    tokens: list[int]
    hidden_rows: list[int]
    want: int


class SpecDecoder:
    def __init__(self, runner: ModelRunner, num_steps: int):
        self.runner, self.k = runner, num_steps
        self.verified_rows = 0  # rows verified with drafts, over all steps
        self.verified_tokens = 0  # tokens those rows gained

    @property
    def accept_length(self) -> float:
        """Mean tokens gained per verified row (1.0 = no draft ever accepted)."""
        return self.verified_tokens / self.verified_rows if self.verified_rows else 0.0

    def budget(self, req: Req) -> int:
        """Drafts req can take at its next verify (it is decoding: num_computed = seq_len - 1): at most
        k, none past max_new_tokens or the context."""
        if not takes_drafts(req):
            return 0
        left = req.params.max_new_tokens - len(req.output_ids) - 1
        room = self.runner.context_length - 1 - req.num_computed
        return max(0, min(self.k, left, room))

    # ---- verify ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def verify(self, items: list[BatchItem], drafts: list[list[int]]) -> tuple[list[list[int]], list[ItemResult]]:
        """One step over decode items, item i's row being its token and drafts[i]. Returns per item the
        candidate tokens in order (accepted drafts, then the model's token; one sampled token for a
        row without drafts) and the ItemResults of the rows without drafts (sampled as usual)."""
        from hybrid_sgl.runner.model_runner import ItemResult

        r = self.runner
        tokens, cuts, rows, draft_rows, plain_rows = [], [], [], [], []
        for i, (it, d) in enumerate(zip(items, drafts)):
            run = it.req.token_slice(it.start, it.end) + d
            offset = sum(len(t) for t in tokens)
            tokens.append(run)
            if d:
                state_rows = r.allocator.draft_rows(it.req.slot)
                cuts.append([(it.start + p, state_rows[p - 1]) for p in range(1, len(d) + 1)])
                draft_rows.append((i, len(rows)))
                rows.extend(range(offset, offset + len(run)))
            else:
                cuts.append([])
                plain_rows.append((i, len(rows)))
                rows.append(offset + len(run) - 1)
        plan = StepPlan(mode=ForwardMode.EXTEND, tokens=tokens, prefix_lens=[it.start for it in items],
                        slots=[it.req.slot for it in items], snapshots=cuts if draft_rows else None, logit_rows=rows)
        logits = r.forward_step(plan)
        results = [ItemResult() for _ in items]
        if plain_rows:
            r._sample(logits, items, results, plain_rows)
        candidates = [[res.next_token] for res in results]
        if draft_rows:
            first = [row for _, row in draft_rows]
            idx = torch.cat([torch.arange(f, f + len(drafts[i]) + 1) for (i, _), f in zip(draft_rows, first)])
            greedy = logits[idx.to(logits.device)].argmax(dim=-1).tolist()
            at = 0
            for i, _ in draft_rows:
                d = drafts[i]
                own = greedy[at:at + len(d) + 1]
                at += len(d) + 1
                j = 0
                while j < len(d) and d[j] == own[j]:
                    j += 1
                candidates[i] = d[:j] + [own[j]]
                self.verified_rows += 1
        return candidates, results

    def keep(self, req: Req, run_len: int, kept: int) -> None:
        """req's verify row of run_len tokens keeps its first `kept` (1..run_len): its slot's state goes
        back to the state after them."""
        self.verified_tokens += kept
        if kept < run_len:
            r = self.runner
            r.state_pool.copy_slot(r.allocator.draft_rows(req.slot)[kept - 1], req.slot)

    # ---- draft -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def draft(self, entries: list[DraftEntries]) -> list[list[int]]:
        """Run the entries through the MTP layer (one extend pass) and chain each one's drafts; needs
        the step's final hidden states in runner.last_hidden and pages up to the last draft entry."""
        r = self.runner
        if not entries:
            return []
        assert all(e.tokens for e in entries), "an entry list is empty"
        model, hidden = r.model, r.last_hidden
        plan = StepPlan(mode=ForwardMode.EXTEND, tokens=[e.tokens for e in entries],
                        prefix_lens=[e.start for e in entries], slots=[e.req.slot for e in entries])
        fb = r.eager_batch(plan)
        rows = torch.tensor([row for e in entries for row in e.hidden_rows], device=hidden.device)
        out = model.draft_hidden(fb.input_ids, hidden[rows], fb)
        last = torch.tensor(list(_last_rows(entries)), device=out.device)
        h = out[last]
        proposed = [[t] for t in model.compute_logits(h).argmax(dim=-1).tolist()]
        live = [i for i, e in enumerate(entries) if e.want > 1]
        h = h[torch.tensor(live, device=h.device, dtype=torch.long)]
        step = 1
        while live:  # entry (d_step, the MTP layer's own last output) at the position after the last one
            plan = StepPlan(mode=ForwardMode.DECODE, tokens=[[proposed[i][-1]] for i in live],
                            prefix_lens=[entries[i].start + len(entries[i].tokens) - 1 + step for i in live],
                            slots=[entries[i].req.slot for i in live])
            fb = r.eager_batch(plan)
            h = model.draft_hidden(fb.input_ids, h, fb)
            for i, t in zip(live, model.compute_logits(h).argmax(dim=-1).tolist()):
                proposed[i].append(t)
            step += 1
            keep = [n for n, i in enumerate(live) if entries[i].want > step]
            h, live = h[torch.tensor(keep, device=h.device, dtype=torch.long)], [live[n] for n in keep]
        return [p[:e.want] for p, e in zip(proposed, entries)]


def _last_rows(entries: list[DraftEntries]):
    at = 0
    for e in entries:
        at += len(e.tokens)
        yield at - 1
