"""Chained speculative iterations: verify, accept, roll back and draft on the device, with no host read
between them, so the host may launch iteration N + 1 before it reads iteration N (scheduler/speculative.py;
the default, --disable-speculative-overlap turns it off).

An iteration over B rows of k + 1 tokens [x, d1..dk] (runner/speculative.py explains the method):
1. verify: the model over the rows, each starting at its slot's length in `slot_lens` (on the device);
   the recurrent kernels write the state after each of the first k tokens into the slot's draft rows;
2. accept: a greedy row keeps acc = the leading drafts equal to the argmax at their positions, then the
   argmax at acc; a sampled row keeps what speculative sampling over its filtered distributions keeps
   (verify_scoring.speculative_sample_rows): out[j] = d[j + 1] for j < acc, then the row's token (kept =
   acc + 1 tokens);
3. roll back: a row that keeps fewer than k + 1 tokens copies its draft row kept - 1 into its slot (with
   --speculative-rollback replay: the conv states so, and the gated delta rule replays the kept tokens);
4. draft: the MTP layer over all k + 1 entries of each row (entry j: out[j] and the final hidden state at
   j; entries past the kept ones write MTP KV that the next iteration overwrites before anything reads
   it), d1 from the last kept entry; slot_lens += kept; k - 1 chained one-entry passes at lens - 1 + s;
5. the next iteration's rows [out[kept - 1], d1..dk] stay on the device; out, kept and the drafts are
   copied to the host, which reads them later (PendingChain.results).
A row ends on the device where the host's result rules end its request by a stop token (EOS included) or
by length (_end_rows): it keeps the tokens up to there, and later iterations run it as a pad row, leaving
its state after its own tokens. A stop string the device cannot see; scheduler/speculative.py handles that.
Rows with a grammar, logprobs, logit adjustments or a seed of their own do not chain (SpecChain.takes): a batch
with one verifies as before. Each iteration is one CUDA graph per (rows, whether any row samples).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from hybrid_sgl.batch import SHORT_ROW_TOKENS, ForwardMode, StepPlan, device_index
from hybrid_sgl.runner import step_inputs
from hybrid_sgl.runner.cuda_graph import capture_each
from hybrid_sgl.runner.sampler import filtered_probs_rows, row_filters
from hybrid_sgl.runner.verify_scoring import speculative_sample_rows
from triton_kernels.state_rows import copy_state_rows, copy_state_rows_ref

if TYPE_CHECKING:
    from hybrid_sgl.runner.model_runner import BatchItem
    from hybrid_sgl.runner.speculative import SpecDecoder
    from hybrid_sgl.scheduler.request import Req


@dataclass
class PendingChain:
    """An iteration launched on the device whose tokens the host has not read yet."""

    items: list[BatchItem]
    next_ids: torch.Tensor  # [B, k + 1] int64: the rows of the next iteration (device)
    host: torch.Tensor  # [B, 2k + 2] int64 (pinned on CUDA): out [k + 1] | kept | drafts [k], by an async copy
    done: torch.cuda.Event | None
    # finished earlier, their slots free after this iteration: (request, the prefix its slot's state is after, or
    # None when the iteration changed it)
    deferred: list[tuple[Req, int | None]] = field(default_factory=list)

    def results(self) -> list[tuple[list[int], list[int]]]:
        """Waits for the iteration; per row (the tokens it keeps, the next drafts)."""
        if self.done is not None:
            self.done.synchronize()
        k1 = self.host.shape[1] // 2
        return [(row[:row[k1]], row[k1 + 1:]) for row in self.host.tolist()]


MAX_STOPS = 8  # stop token ids (EOS ones included) a chained row may carry


class SpecChain:
    def __init__(self, spec: SpecDecoder):
        r, k = spec.runner, spec.k
        self.spec, self.runner, self.k = spec, r, k
        rows = spec.max_verify_rows
        a = r.allocator
        self.verify_inputs = step_inputs.for_runner(r, rows * (k + 1), rows)
        self.chain_inputs = step_inputs.for_runner(r, rows, rows)
        self.slot_lens = torch.zeros(a.num_slots + 1, dtype=torch.int64, device=r.device)
        table = [a.draft_rows(s) for s in range(a.num_slots)] + [[a.pad_slot] * k]
        self.draft_table = torch.tensor(table, dtype=torch.int64).to(r.device)  # [slots + 1, k] state-pool rows
        on_gpu = r.device.type == "cuda"
        self._host = torch.zeros((2, rows, 2 * k + 2), dtype=torch.int64, pin_memory=on_gpu)
        self._turn = 0
        # (rows, sampled) -> (graph, (next rows, out | kept | drafts)) of the captured iterations
        self.graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, torch.Tensor]]] = {}
        # each row's sampling filters (sampler.row_filters; temperature 0: a greedy row), read by the iteration
        self.filters = torch.zeros(rows, 4, dtype=torch.float32, device=r.device)
        # per slot, what ends a row on the device (so that the iterations behind leave its state alone): its stop
        # token ids (-1: none), the tokens it may still gain (max_new_tokens, the context), whether it goes on
        self.stops = torch.full((a.num_slots + 1, MAX_STOPS), -1, dtype=torch.int64, device=r.device)
        self.budget = torch.zeros(a.num_slots + 1, dtype=torch.int64, device=r.device)
        self.alive = torch.zeros(a.num_slots + 1, dtype=torch.bool, device=r.device)
        # TEST-ONLY (bench/spec_decode.py --accept): each draft is kept with this probability, whatever the model
        # says, so that the pipeline can be timed on dummy weights; the tokens are then not the model's
        self.forced_acceptance: float | None = None

    def _stop_ids(self, req: Req) -> list[int]:
        eos = [] if req.params.ignore_eos else list(self.runner.config.eos_token_ids)
        return eos + list(req.params.stop_token_ids or [])

    def takes(self, items: list[BatchItem]) -> bool:
        """Whether a decode batch may run chained iterations: no row with a grammar, logprobs or logit adjustments
        (their scoring needs the host between iterations), a seed of its own (its generator draws in the host's
        order; the device draws a batch at once) or more than MAX_STOPS stop token ids."""
        return all(it.sample and it.req.grammar is None and not it.req.return_logprob
                   and not it.req.params.adjusts_logits and (it.req.params.greedy or it.req.generator is None)
                   and len(self._stop_ids(it.req)) <= MAX_STOPS for it in items)

    @torch.inference_mode()
    def launch(self, items: list[BatchItem], prev: PendingChain | None = None, prev_rows: list[int] | None = None,
               drafts: list[list[int]] | None = None) -> PendingChain:
        """Launch one iteration over `items` without waiting. Without `prev`, each row is the request's token
        at item.start and its k drafts (drafts[i]), from the host; else row i is the next row that `prev` (in
        flight) made in its row prev_rows[i]. Replays the graph of the smallest captured row count that holds
        the rows (pad rows touch nothing), else runs eagerly."""
        r, k, b = self.runner, self.k, len(items)
        slots = [it.req.slot for it in items]
        if prev is None:
            assert all(len(d) == k for d in drafts), "a chain starts from k drafts a row"
            ids = device_index([x for it, d in zip(items, drafts) for x in it.req.token_slice(it.start, it.end) + d],
                               r.device)
            self._start_rows(items)
        else:
            ids = prev.next_ids.index_select(0, device_index(prev_rows, r.device)).view(-1)
        rows = self._rows_for(b)
        sampled = not all(it.req.params.greedy for it in items)
        if sampled:  # each row's filters; pad rows greedy
            greedy = torch.tensor([it.req.params.greedy for it in items]).to(r.device, non_blocking=True)
            self.filters[:rows, 0] = 0.0
            self.filters[:b].copy_(row_filters([it.req for it in items], r.config.vocab_size, r.device))
            self.filters[:b, 0].masked_fill_(greedy, 0.0)
        a = r.allocator  # (prefix_lens: offsets over slot_lens; the cuts: run positions 1..k -> the draft rows)
        self.verify_inputs.fill(StepPlan(mode=ForwardMode.EXTEND, tokens=[[0] * (k + 1)] * b, prefix_lens=[0] * b,
                                         slots=slots, ids_on_device=True,
                                         snapshots=[list(zip(range(1, k + 1), a.draft_rows(s))) for s in slots]),
                                rows * (k + 1), rows, prev_ids=ids)
        self.chain_inputs.fill(StepPlan(mode=ForwardMode.DECODE, tokens=[[0]] * b, prefix_lens=[0] * b, slots=slots,
                                        ids_on_device=True), rows, rows)
        if (rows, sampled) in self.graphs:
            graph, (next_ids, packed) = self.graphs[rows, sampled]
            graph.replay()
        else:
            next_ids, packed = self._iterate(rows, sampled)
        return self._pending(items, next_ids[:b], packed[:b])

    def _rows_for(self, b: int) -> int:
        """The row count an iteration of b rows runs at: the smallest captured one that holds them, else b."""
        return min((n for n, _ in self.graphs if n >= b), default=b)

    def _start_rows(self, items: list[BatchItem]) -> None:
        """The per-slot tables of rows that start a chain: length, stop ids, budget (the tokens the request may
        still gain: max_new_tokens, and the context as the result rules count it), alive."""
        r, n = self.runner, len(items)
        slots = device_index([it.req.slot for it in items], r.device)
        stops = [self._stop_ids(it.req) for it in items]
        budget = [min(it.req.params.max_new_tokens - len(it.req.output_ids), r.context_length - it.start - 1)
                  for it in items]
        self.slot_lens.index_copy_(0, slots, device_index([it.start for it in items], r.device))
        self.stops.index_copy_(0, slots, device_index([x for ids in stops for x in ids + [-1] * (MAX_STOPS - len(ids))],
                                                      r.device).view(n, MAX_STOPS))
        self.budget.index_copy_(0, slots, device_index(budget, r.device))
        self.alive.index_fill_(0, slots, True)

    def _iterate(self, B: int, sampled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """The iteration over the B rows the step buffers hold (pad rows included); device work only, so that
        it can be captured. sampled: some rows sample (their filters in self.filters, temperature 0 for the
        greedy ones); else every row is greedy. Returns the next rows [B, k + 1] and out | kept | drafts
        [B, 2k + 2]."""
        r, k = self.runner, self.k
        replay = self.spec.replay
        fb = self.verify_inputs.batch(ForwardMode.EXTEND, B * (k + 1), B, with_prev=True,
                                      short_rows=k + 1 <= SHORT_ROW_TOKENS, replay_recurrent=replay,
                                      slot_lens=self.slot_lens, slot_alive=self.alive)
        slots = fb.state_slots.long()
        real = (slots != self.runner.allocator.pad_slot).long()
        hidden = r.model(fb)
        logits = r.model.compute_logits(hidden)
        own = logits.argmax(dim=-1).view(B, k + 1)
        rows_in = fb.input_ids.view(B, k + 1)
        acc = self._accepted(rows_in[:, 1:], own[:, :k])  # [B]
        token = own.gather(1, acc[:, None])[:, 0]  # [B]: the row's token after the drafts it keeps
        if sampled:  # the sampled rows' speculative sampling over their filtered distributions
            f = self.filters[:B]
            greedy = f[:, 0] == 0
            filters = [x.repeat_interleave(k + 1) for x in (torch.where(greedy, 1.0, f[:, 0]), *f[:, 1:].unbind(1))]
            probs = filtered_probs_rows(logits, *filters).view(B, k + 1, -1)
            acc_s, token_s = speculative_sample_rows(probs, rows_in[:, 1:])
            acc, token = torch.where(greedy, acc, acc_s), torch.where(greedy, token, token_s)
        j = torch.arange(k + 1, device=r.device)
        # [B, k + 1]: the kept drafts, the row's token, then what the device ignores
        out = torch.where(j < acc[:, None], torch.cat([rows_in[:, 1:], own[:, k:]], dim=1), own)
        out = out.scatter(1, acc[:, None], token[:, None])
        kept, acc = self._end_rows(slots, out, acc, real)
        self._roll_back(slots, kept, ssm=not replay)
        if replay:  # the gated delta rule's slots are untouched: run each row's kept tokens again (pad rows: none)
            rows = {"cu_seqlens": fb.cu_seqlens, "state_slots": fb.state_slots,
                    "has_initial_state": fb.has_initial_state}
            for layer in self.spec.replay_layers:
                layer.replay(r.state_pool, rows, kept.int(), B * (k + 1))
        # the MTP layer: entry j of a row takes out[j] and the final hidden state at j
        h_all = r.model.draft_hidden(out.view(-1), hidden, dataclasses.replace(fb, input_ids=out.view(-1)))
        h = h_all.index_select(0, torch.arange(B, device=r.device) * (k + 1) + acc)
        self.slot_lens.index_add_(0, slots, kept)
        drafts = [self._propose(h, slots, 1)]
        for s in range(1, k):
            self.chain_inputs.prev_ids[:B].copy_(drafts[-1])
            fb_s = self.chain_inputs.batch(ForwardMode.DECODE, B, B, with_prev=True, slot_lens=self.slot_lens,
                                           shift=s - 1, slot_alive=self.alive)
            h = r.model.draft_hidden(fb_s.input_ids, h, fb_s)
            drafts.append(self._propose(h, slots, s + 1))
        new_drafts = torch.stack(drafts, dim=1)  # [B, k]
        last = out.gather(1, acc[:, None])  # [B, 1]: the row's last kept token, the next row's first
        return torch.cat([last, new_drafts], dim=1), torch.cat([out, kept[:, None], new_drafts], dim=1)

    @torch.inference_mode()
    def capture_graphs(self, batch_sizes: list[int]) -> None:
        """Capture the whole iteration at each row count (largest first), greedy and with sampled rows, in one
        memory pool (one iteration runs at a time, and its outputs are read before the next replay), on pad rows."""
        k = self.k
        no_verify = StepPlan(mode=ForwardMode.EXTEND, tokens=[], prefix_lens=[], slots=[])
        no_drafts = StepPlan(mode=ForwardMode.DECODE, tokens=[], prefix_lens=[], slots=[])

        def prepare(key: tuple[int, bool]) -> None:
            rows, sampled = key
            self.verify_inputs.fill(no_verify, rows * (k + 1), rows)
            self.chain_inputs.fill(no_drafts, rows, rows)
            self.filters[:rows, 0] = 0.0

        keys = [(rows, sampled) for rows in sorted(batch_sizes, reverse=True) for sampled in (True, False)]
        self.graphs = capture_each(keys, prepare, lambda key: self._iterate(*key))

    def release(self) -> None:
        self.graphs = {}

    def _end_rows(self, slots: torch.Tensor, out: torch.Tensor, acc: torch.Tensor,
                  real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What ends a row on the device, as the host's result rules end its request: a stop token among its
        kept tokens (the first one), or its budget (max_new_tokens, the context). slots [B]; out [B, k + 1];
        acc [B] the drafts kept; real [B] 1 for a live row (0: a pad row, or one that ended before). Marks the
        rows that end (their slots then run as pad rows) and returns (kept tokens [B], the drafts kept [B])."""
        k = self.k
        j = torch.arange(k + 1, device=out.device)
        stop = (out[:, :, None] == self.stops.index_select(0, slots)[:, None, :]).any(-1) & (j <= acc[:, None])
        first = torch.where(stop.any(1), stop.long().argmax(1), k + 1)  # [B]: the first stop token's place
        left = self.budget.index_select(0, slots)
        kept = torch.minimum(torch.minimum(acc + 1, first + 1), left) * real
        ended = (real > 0) & ((first <= acc) | (kept >= left))
        self.budget.index_add_(0, slots, -kept)
        self.alive.index_put_((slots,), self.alive.index_select(0, slots) & ~ended)
        return kept, (kept - 1).clamp(min=0)

    def _propose(self, h: torch.Tensor, slots: torch.Tensor, m: int) -> torch.Tensor:
        """The drafts d_m [B] from the MTP layer's outputs h [B, H]; d_m lies at position slot_lens[slots] + m
        (after this iteration's lengths), which only the tests' scripted drafts read."""
        return self.spec._draft_ids(h)

    def _accepted(self, drafts: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
        """drafts, own [B, k] -> the leading drafts each row keeps [B] int64."""
        if self.forced_acceptance is not None:  # TEST-ONLY, see __init__
            match = torch.rand(drafts.shape, device=drafts.device) < self.forced_acceptance
        else:
            match = drafts == own
        return match.long().cumprod(dim=1).sum(dim=1)

    def _roll_back(self, slots: torch.Tensor, kept: torch.Tensor, ssm: bool = True) -> None:
        """Each row's slot [B] that keeps fewer than k + 1 tokens takes its draft row kept - 1 (the state after
        its kept tokens); the others (pad rows too) copy nothing. One masked copy per state tensor (on CUDA a
        kernel whose unflagged programs return at once; a row's state is tens of MiB on real shapes).
        ssm=False: the conv states only (the replay rolls the gated delta rule back)."""
        k = self.k
        src = self.draft_table.index_select(0, slots).gather(1, (kept - 1).clamp(min=0, max=k - 1)[:, None])[:, 0]
        flags = ((kept >= 1) & (kept <= k)).long()
        pool = self.runner.state_pool
        copy = copy_state_rows if pool.ssm.is_cuda else copy_state_rows_ref
        for state in (pool.conv, pool.ssm) if ssm else (pool.conv,):
            copy(state=state, src=src, dst=slots, flags=flags)

    def _pending(self, items: list[BatchItem], next_ids: torch.Tensor, packed: torch.Tensor) -> PendingChain:
        on_gpu = self.runner.device.type == "cuda"
        self._turn ^= 1  # two host buffers in turn: at most two iterations are alive (one launched, one read)
        host = self._host[self._turn, :len(items)]
        host.copy_(packed, non_blocking=on_gpu)
        done = None
        if on_gpu:
            done = torch.cuda.Event()
            done.record()
        return PendingChain(items=items, next_ids=next_ids, host=host, done=done)
