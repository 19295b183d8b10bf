"""Speculative decoding with the model's own MTP layer (NEXTN): draft, verify, roll back.

A decoding request carries up to k draft tokens d1..dk, proposed by the MTP layer
(models/mtp.py). Its next decode step is a verify row of k + 1 tokens [x_L, d1..dk] at positions
L..L+k in an extend-shaped step, which gives the model's distribution p_i after each of them.
- Greedy: the model's own token after each is t_i = argmax p_i; the drafts are accepted while
  d_i == t_i, and the request gains d1..dj and t(j+1): exactly the tokens plain greedy decoding gives.
- Sampled (temperature, top-k, top-p, min-p): the draft is a point (the MTP layer's argmax), so d_i
  is accepted with probability p_i(d_i); the first rejected position draws from p_i without d_i
  (renormalized), and a row whose drafts are all accepted draws its last token from p(k+1). Each
  token then has the distribution plain sampling gives (speculative sampling), though not the same
  draws for a seed.
- Every verify position is scored as plain decoding would score it after the drafts before it: logit
  bias, penalties and min_new_tokens over the output as if those drafts were kept (AfterDrafts), a
  grammar's mask after them (drafts it rejects, or that would end it, are cut first); logprobs are
  read off the row's logits.

Rollback: the verify step's recurrent kernels write the state after each of the first k tokens of
a row into the slot's k verify rows (snapshot cuts, ForwardBatch.snap_pos), and the slot holds the
state after all k + 1. Keeping m tokens copies row m - 1 into the slot (m = k + 1: nothing to do).
With --speculative-rollback replay (vLLM's ReplaySSM) the gated-delta-rule layers write no state in
the verify step and keep its inputs; rollback then runs each row's m kept tokens again from the
untouched slot (one short-row kernel a layer, GatedDeltaNet.replay), and copies only the conv1d
state of row m - 1 (bench/README.md: the replay writes the 2 MiB state once where the snapshots write
it k + 1 times). KV written past the kept tokens is overwritten before anything reads it. Rows
without drafts in the same step (no budget left, or every draft cut by a grammar) are one-token rows
sampled as in any decode step (replayed with their one token).

Drafting: the MTP layer's entry i takes the token at i + 1 and the model's final hidden state at i.
After every step, each row's new entries (the prompt chunk's, or the kept tokens') run through it in
one extend pass, whose last entry proposes d1; d2..dk come from one-entry passes that feed the MTP
layer's own output back. Its KV sits in the KV pool as the layer after the model's, at the entries'
positions, so cached prefixes carry it too.

High concurrency: while disable_batch_size requests or more run or wait (--speculative-disable-by-batch-size),
decode steps are plain decode steps, with no drafts and no MTP pass (scheduler/speculative.py). The MTP layer's KV then
has no entries at those steps' positions; drafts made after the batch shrinks attend over them as they are,
which can lower their acceptance but never changes a token (every draft is verified).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hybrid_sgl.batch import ForwardMode, StepPlan, device_index
from hybrid_sgl.layers.gdn import GatedDeltaNet
from hybrid_sgl.runner.cuda_graph import StepGraphs
from hybrid_sgl.runner.spec_chain import SpecChain
from hybrid_sgl.runner.step_results import ItemResult
from hybrid_sgl.runner.verify_scoring import accepted_tokens, add_logprobs, fit_grammars, scored_logits

if TYPE_CHECKING:
    from hybrid_sgl.runner.model_runner import BatchItem, ModelRunner
    from hybrid_sgl.scheduler.request import Req


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
    def __init__(self, runner: ModelRunner, num_steps: int, disable_batch_size: int = 0, replay: bool = False,
                 chain: bool = False):
        """chain: greedy verify steps may run as chained iterations (runner/spec_chain.py, self.chain)."""
        self.runner, self.k = runner, num_steps
        self.disable_batch_size = disable_batch_size  # decode steps of this many rows or more take no drafts (0: never)
        self.verified_rows = 0  # rows verified with drafts, over all steps
        self.verified_tokens = 0  # tokens those rows gained
        self._rollbacks: list[tuple[int, int]] = []  # (verify row, slot) state copies keep() asked for
        self.replay = replay  # --speculative-rollback replay: the GDN layers keep checkpoints and inputs
        running = runner.plan.max_running_requests
        # the most rows a verify step holds: below the batch limit, where decode steps take drafts
        self.max_verify_rows = min(running, disable_batch_size - 1) if disable_batch_size else running
        self.replay_layers = []
        if replay:
            self.replay_layers = [m for m in runner.model.modules() if isinstance(m, GatedDeltaNet)]
            for layer in self.replay_layers:  # (on the 9B shape 16.5 KB a token and layer: ~0.1 GB at 55 rows)
                layer.keep_inputs_for_replay(self.max_verify_rows * (num_steps + 1), runner.dtype, runner.device)
        self._verified: StepPlan | None = None  # the last verify step, until its rollback
        self._kept: dict[int, int] = {}  # its rows' kept tokens (by slot), keep() tells them
        # CUDA graphs of the MTP passes (capture_graphs): the first over short rows of entries, the chained
        # one-entry passes decode-shaped; draft_in is their static input of final hidden states
        self.first_graphs: StepGraphs | None = None
        self.chain_graphs: StepGraphs | None = None
        self.draft_in: torch.Tensor | None = None
        self.chain = SpecChain(self) if chain else None

    def capture_graphs(self, short_shapes: list[tuple[int, int]], batch_sizes: list[int]) -> None:
        """Capture the MTP passes: the first passes at the verify steps' short-row shapes (a verify row keeps
        at most k + 1 tokens), the chained one-entry passes at the decode batch sizes."""
        r = self.runner
        self.draft_in = torch.zeros(r.inputs.max_tokens, r.config.hidden_size, dtype=r.dtype, device=r.device)

        def forward(fb):
            return r.model.draft_hidden(fb.input_ids, self.draft_in[:fb.num_tokens], fb)

        self.first_graphs = StepGraphs(model=r.model, inputs=r.inputs, mode=ForwardMode.EXTEND, shapes=short_shapes,
                                       short_rows=True, forward=forward)
        self.chain_graphs = StepGraphs(model=r.model, inputs=r.inputs, mode=ForwardMode.DECODE,
                                       shapes=[(bs, bs) for bs in batch_sizes], with_prev=True, forward=forward)
        self.first_graphs.capture()
        self.chain_graphs.capture()
        if self.chain is not None:
            self.chain.capture_graphs(batch_sizes)

    def release(self) -> None:
        self.first_graphs = self.chain_graphs = self.draft_in = None
        if self.chain is not None:
            self.chain.release()

    def _mtp_pass(self, plan: StepPlan, hidden: torch.Tensor, graphs: StepGraphs | None,
                  prev_ids: torch.Tensor | None = None) -> torch.Tensor:
        """The MTP layer over the plan's entries, hidden [T, H] the final hidden state before each:
        a replay of the plan's graph shape, else eagerly. prev_ids: the ids the plan's prev_rows take
        (on the device). Returns [T, H]."""
        r = self.runner
        shape = graphs.shape_for(plan) if graphs is not None else None
        if shape is None:
            return r.eager_forward(plan, prev_ids, lambda fb: r.model.draft_hidden(fb.input_ids, hidden, fb))
        self.draft_in[: hidden.shape[0]].copy_(hidden)
        return graphs.run(plan, shape, prev_ids=prev_ids)

    def _draft_ids(self, hidden: torch.Tensor) -> torch.Tensor:
        """The MTP layer's outputs [N, H] -> the drafted ids [N]: the argmax over the whole vocabulary, or over
        the --speculative-token-map ids (runner.draft_vocab)."""
        r = self.runner
        if r.draft_vocab is not None:
            return r.draft_vocab.argmax(hidden)
        return r.model.compute_logits(hidden).argmax(dim=-1)

    def speculates(self, rows: int) -> bool:
        """Whether a decode step of `rows` requests verifies drafts (else it is a plain decode step)."""
        return not self.disable_batch_size or rows < self.disable_batch_size

    @property
    def accept_length(self) -> float:
        """Mean tokens gained per verified row (1.0 = no draft ever accepted)."""
        return self.verified_tokens / self.verified_rows if self.verified_rows else 0.0

    def budget(self, req: Req) -> int:
        """Drafts req can take at its next verify (it is decoding: num_computed = seq_len - 1): at most
        k, none past max_new_tokens or the context."""
        left = req.params.max_new_tokens - len(req.output_ids) - 1
        room = self.runner.context_length - 1 - req.num_computed
        return max(0, min(self.k, left, room))

    # ---- verify ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def verify(self, items: list[BatchItem], drafts: list[list[int]]) -> list[list[ItemResult]]:
        """One step over decode items, item i's row being its token and drafts[i]. Returns per item the
        results of its candidate tokens in order: the accepted drafts, then the model's token (with their
        logprobs when the request asks); a row without drafts: its one token, sampled as usual.
        A constrained request's drafts are first cut (in `drafts`, in place) before the first one its grammar
        rejects or that would end it, and each verify position is scored under the grammar's mask there."""

        r = self.runner
        masks = fit_grammars(items, drafts, r.config.vocab_size)
        tokens, cuts, rows, draft_rows, plain_rows = [], [], [], [], []
        offset = 0
        for i, (it, d) in enumerate(zip(items, drafts)):
            run = it.req.token_slice(it.start, it.end) + d
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
            offset += len(run)
        plan = StepPlan(mode=ForwardMode.EXTEND, tokens=tokens, prefix_lens=[it.start for it in items],
                        slots=[it.req.slot for it in items], snapshots=cuts if draft_rows else None, logit_rows=rows,
                        replay_recurrent=self.replay)
        logits = r.forward_step(plan)
        if self.replay:
            self._verified, self._kept = plan, {}
        results = [ItemResult() for _ in items]
        if plain_rows:
            r._sample(logits, items, results, plain_rows)
        scored, masks = scored_logits(logits, items, drafts, draft_rows, masks, r.config.eos_token_ids)
        kept = accepted_tokens(scored, items, drafts, draft_rows)
        out = [[result] for result in results]
        for i, tokens in kept.items():
            out[i] = [ItemResult(next_token=t) for t in tokens]
        add_logprobs(logits, [(f, items[i].req, out[i], masks.get(i)) for i, f in draft_rows
                              if items[i].req.return_logprob])
        self.verified_rows += len(draft_rows)
        return out

    def keep(self, req: Req, run_len: int, kept: int) -> None:
        """req's verify row of run_len tokens keeps its first `kept` (1..run_len): its slot's state is to go
        back to the state after them, in the next roll_back (one copy for the whole step)."""
        self.verified_tokens += kept
        if self.replay:
            self._kept[req.slot] = kept
        if kept < run_len:
            self._rollbacks.append((self.runner.allocator.draft_rows(req.slot)[kept - 1], req.slot))

    def roll_back(self) -> None:
        """Queue the state copies of the rows kept since the last call (before anything reads the slots);
        with replay, the conv1d states' copies and the gated delta rule's replay of the last verify step."""
        if self._rollbacks:
            src, dst = zip(*self._rollbacks)
            self.runner.state_pool.copy_slots(list(src), list(dst), ssm=not self.replay)
            self._rollbacks = []
        if self._verified is not None:
            self._replay(self._verified)
            self._verified = None

    def warm_up(self) -> None:
        """Compile the replay's kernel variants (gdn_rows with row_lens; its launch config depends on the row
        count) before serving, through _replay itself (the same argument types as served): steps of 1 to the
        most rows a verify step holds, every row in the pad slot, which the kernel skips, so nothing is
        written; one layer each but the one-row step (the layers share the kernel and its shapes)."""
        if self.replay:
            pad = self.runner.state_pool.pad_slot
            for n in range(1, self.max_verify_rows + 1):
                plan = StepPlan(mode=ForwardMode.EXTEND, tokens=[[0]] * n, prefix_lens=[1] * n, slots=[pad] * n)
                self._replay(plan, self.replay_layers if n == 1 else self.replay_layers[:1])

    def _replay(self, plan: StepPlan, layers: list[GatedDeltaNet] | None = None) -> None:
        """Each row of `plan` (a replayed verify step) runs its kept tokens again in every GDN layer (or in
        `layers`): the rows with drafts those keep() was told, the others their one token."""
        cu = [0, *itertools.accumulate(len(run) for run in plan.tokens)]
        segments = [cu, plan.slots, [int(p > 0) for p in plan.prefix_lens], [self._kept.get(s, 1) for s in plan.slots]]
        flat, starts = [], []
        for seg in segments:  # each at a 16-byte boundary: Triton specializes on pointer alignment, and a varying
            starts.append(len(flat))  # alignment would compile the kernel again while serving
            flat += seg + [0] * (-len(seg) % 2)
        packed = device_index(flat, self.runner.device)  # int64: one host-to-device copy
        cu_t, slots_t, init_t, lens_t = (packed[i:i + len(seg)] for i, seg in zip(starts, segments))
        rows = {"cu_seqlens": cu_t, "state_slots": slots_t, "has_initial_state": init_t}
        for layer in self.replay_layers if layers is None else layers:
            layer.replay(self.runner.state_pool, rows, lens_t, plan.num_tokens)

    # ---- draft -----------------------------------------------------------------------------------
    @torch.inference_mode()
    def draft(self, entries: list[DraftEntries]) -> list[list[int]]:
        """Run the entries through the MTP layer (one extend pass) and chain each one's drafts; needs
        the step's final hidden states in runner.last_hidden and pages up to the last draft entry. The
        passes are queued back to back, each taking the last one's argmax on the device (prev_rows);
        the host reads the drafts once, at the end."""
        r = self.runner
        if not entries:
            return []
        assert all(e.tokens for e in entries), "an entry list is empty"
        hidden = r.last_hidden
        plan = StepPlan(mode=ForwardMode.EXTEND, tokens=[e.tokens for e in entries],
                        prefix_lens=[e.start for e in entries], slots=[e.req.slot for e in entries])
        out = self._mtp_pass(plan, hidden[device_index([row for e in entries for row in e.hidden_rows], hidden.device)],
                             self.first_graphs)
        if not any(e.want for e in entries):  # the pass only writes the MTP layer's KV
            return [[] for _ in entries]
        h = out[device_index(list(_last_rows(entries)), out.device)]
        ids = self._draft_ids(h)
        columns = [(list(range(len(entries))), ids)]  # (entries, their draft ids [len(entries)]) per draft
        step = 1
        while True:  # entry (d_step, the MTP layer's own last output) at the position after the last one
            was = columns[-1][0]
            keep = [n for n, i in enumerate(was) if entries[i].want > step]
            if not keep:
                break
            live = [was[n] for n in keep]
            if len(keep) < len(was):
                index = device_index(keep, h.device)
                h, ids = h[index], ids[index]
            plan = StepPlan(mode=ForwardMode.DECODE, tokens=[[0]] * len(live),
                            prefix_lens=[entries[i].start + len(entries[i].tokens) - 1 + step for i in live],
                            slots=[entries[i].req.slot for i in live], prev_rows=list(range(len(live))))
            h = self._mtp_pass(plan, h, self.chain_graphs, prev_ids=ids)
            ids = self._draft_ids(h)
            columns.append((live, ids))
            step += 1
        flat = torch.cat([c for _, c in columns]).tolist()  # the one host read of the drafting
        proposed: list[list[int]] = [[] for _ in entries]
        at = 0
        for live, _ in columns:
            for i in live:
                proposed[i].append(flat[at])
                at += 1
        return [p[:e.want] for p, e in zip(proposed, entries)]


def _last_rows(entries: list[DraftEntries]):
    at = 0
    for e in entries:
        at += len(e.tokens)
        yield at - 1
