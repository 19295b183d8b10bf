"""The batch vocabulary every layer of the engine shares (it imports nothing of the engine's).

- `StepPlan`: one model step as the scheduler decides it: rows (one run of new tokens per request),
  slots, snapshot cuts, logit rows and typed references to tokens the previous step sampled.
- `ForwardBatch`: the same step as device tensors, built once per step by the step-input builder
  (runner/step_inputs.py) and read by every layer.
Tokens per row are free-form: a decode step is a plan of one token per row, a prefill chunk or a
verify step of k + 1 tokens is the same plan with longer rows.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill / chunked prefill / mixed: varlen token runs per request
    DECODE = "decode"  # one token per request


@dataclass(frozen=True)
class StepPlan:
    """tokens[i]: the new tokens of row i, which start at position prefix_lens[i] of the request in
    state slot slots[i]. prev_rows[i] = j >= 0: row i's first token is the one the previous step
    sampled in its row j, still on the device (overlapped decode); tokens[i][0] is then a placeholder.
    snapshots[i]: (position strictly inside row i's run, snapshot index) pairs: the recurrent state
    there is copied into that snapshot during the step. logit_rows: packed token rows that get
    logits (None: every row)."""

    mode: ForwardMode
    tokens: list[list[int]]
    prefix_lens: list[int]
    slots: list[int]
    prev_rows: list[int] | None = None
    snapshots: list[list[tuple[int, int]]] | None = None
    logit_rows: list[int] | None = None

    @property
    def num_rows(self) -> int:
        return len(self.tokens)

    @property
    def num_tokens(self) -> int:
        return sum(len(run) for run in self.tokens)

    @property
    def has_snapshots(self) -> bool:
        return bool(self.snapshots) and any(self.snapshots)

    @property
    def max_seq_len(self) -> int:
        return max((p + len(run) for p, run in zip(self.prefix_lens, self.tokens)), default=0)


@dataclass
class RecurrentRound:
    """One pass of the recurrent layers over some requests' next segment (see ForwardBatch.recurrent).
    rows: [T'] packed-token rows of the segments; cu_seqlens [B'+1]; state_slots / has_initial_state
    [B']; after the pass, each layer's state at snap_src is copied to snap_dst (snapshot indices)."""

    rows: torch.Tensor
    cu_seqlens: torch.Tensor
    state_slots: torch.Tensor
    has_initial_state: torch.Tensor
    snap_src: torch.Tensor
    snap_dst: torch.Tensor


@dataclass
class ForwardBatch:
    """pools are the engine's KVPool / StatePool (None when the model has no such layer)."""

    mode: ForwardMode
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    seq_lens: torch.Tensor  # [B] int32, tokens in cache after this step (prefix + new)
    state_slots: torch.Tensor  # [B] int32, state slot (= page-table row) of each request
    block_table: torch.Tensor  # [B, max_pages] int32
    slot_mapping: torch.Tensor  # [T] int64, flat KV index (page * page_size + offset) of each new token; -1: none
    cu_seqlens: torch.Tensor  # [B+1] int32, token runs of the requests (decode: 0..B)
    has_initial_state: torch.Tensor  # [B] bool, request continues from state in its slot
    kv_pool: object | None
    state_pool: object | None
    rounds: list[RecurrentRound] | None = None  # prefill with snapshots inside runs; None = one pass

    @property
    def batch_size(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def is_decode(self) -> bool:
        return self.mode is ForwardMode.DECODE

    def recurrent(self, state_index: int, core, *rows: torch.Tensor) -> torch.Tensor:
        """Run a recurrent layer's prefill core over the batch: core(cu_seqlens, state_slots,
        has_initial_state, *rows) -> [T, ...], rows being [T, ...] per-token inputs. With snapshots
        inside the runs, the runs are cut there and the core runs once per round of segments, the
        state of state layer `state_index` copied to each snapshot index as its segment ends."""
        if not self.rounds:
            return core(self.cu_seqlens, self.state_slots, self.has_initial_state, *rows)
        out = None
        for r in self.rounds:
            y = core(r.cu_seqlens, r.state_slots, r.has_initial_state, *(t.index_select(0, r.rows) for t in rows))
            if out is None:
                out = y.new_empty((self.num_tokens, *y.shape[1:]))
            out.index_copy_(0, r.rows, y)
            if r.snap_dst.numel():
                self.state_pool.copy_layer(state_index, r.snap_src, r.snap_dst)
        return out
