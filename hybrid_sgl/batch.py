"""The batch vocabulary every layer of the engine shares (it imports nothing of the engine's).

- `StepPlan`: one model step as the scheduler decides it: rows (one run of new tokens per request),
  slots, snapshot cuts, logit rows and typed references to tokens the previous step sampled.
- `ForwardBatch`: the same step as device tensors, built once per step by the step-input builder
  (runner/step_inputs.py) and read by every layer. Snapshot cuts travel as device tensors too: the
  recurrent prefill kernels write the state at each cut themselves, so a cut costs its bytes and no
  host work, and a step with cuts replays a graph like any other.
Tokens per row are free-form: a decode step is a plan of one token per row, a prefill chunk or a
verify step of k + 1 tokens is the same plan with longer rows.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

import torch

MAX_CUTS = 16  # snapshot cuts a row may carry in one step (the kernels' cut arrays are [rows, MAX_CUTS])
# an extend step whose rows all hold at most this many tokens (a speculative verify step, a few-token
# extend) runs its recurrent layers token by token instead of in 64-token chunks (ForwardBatch.short_rows)
SHORT_ROW_TOKENS = 8


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill / chunked prefill / mixed: varlen token runs per request
    DECODE = "decode"  # one token per request


@dataclass(frozen=True)
class StepPlan:
    """tokens[i]: the new tokens of row i, which start at position prefix_lens[i] of the request in
    state slot slots[i]. prev_rows[i] = j >= 0: row i's first token is the one the previous step
    sampled in its row j, still on the device (overlapped decode); tokens[i][0] is then a placeholder.
    ids_on_device: every token comes from the device, the k-th of the packed plan being prev_ids[k] (a
    chained speculative iteration, runner/spec_chain.py); tokens are then placeholders.
    snapshots[i]: (p, snapshot index) pairs with prefix_lens[i] < p <= prefix_lens[i] + len(tokens[i]):
    the recurrent state after the request's first p tokens is copied into that snapshot during the
    step (at most MAX_CUTS a row). logit_rows: packed token rows that get logits (None: every row)."""

    mode: ForwardMode
    tokens: list[list[int]]
    prefix_lens: list[int]
    slots: list[int]
    prev_rows: list[int] | None = None
    ids_on_device: bool = False
    snapshots: list[list[tuple[int, int]]] | None = None
    logit_rows: list[int] | None = None
    # a verify step whose gated-delta-rule layers keep their slots as checkpoints and their inputs, for a
    # replay of each row's kept tokens after the accept decision (ForwardBatch.replay_recurrent)
    replay_recurrent: bool = False

    @property
    def num_rows(self) -> int:
        return len(self.tokens)

    @property
    def num_tokens(self) -> int:
        return sum(len(run) for run in self.tokens)

    @property
    def has_snapshots(self) -> bool:
        return bool(self.snapshots) and any(self.snapshots)

    @functools.cached_property
    def short_rows(self) -> bool:  # (read by each graph set and the eager path: computed once a plan)
        """An extend step whose every row holds at most SHORT_ROW_TOKENS tokens."""
        return self.mode is ForwardMode.EXTEND and all(len(run) <= SHORT_ROW_TOKENS for run in self.tokens)

    @property
    def max_seq_len(self) -> int:
        return max((p + len(run) for p, run in zip(self.prefix_lens, self.tokens)), default=0)


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
    # snapshot cuts (extend steps): snap_pos [B, C] int32, tokens into row b's run after which the recurrent
    # state is copied into state-pool row snap_slots [B, C] int32; -1 = no cut (sorted, valid entries first)
    snap_pos: torch.Tensor | None = None
    snap_slots: torch.Tensor | None = None
    # every row holds at most SHORT_ROW_TOKENS tokens (pad rows aside): recurrent layers step token by token
    short_rows: bool = False
    # (short rows only) the gated-delta-rule layers write no state, neither at the cuts nor at the rows' ends,
    # and keep their inputs, which the kept tokens then run again from the untouched slots (layers/gdn.py:
    # GatedDeltaNet.replay); the conv1d states are written as in any step
    replay_recurrent: bool = False

    @property
    def batch_size(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def is_decode(self) -> bool:
        return self.mode is ForwardMode.DECODE

    def recurrent(self, core, *rows: torch.Tensor) -> torch.Tensor:
        """Run a recurrent layer's prefill core over the batch: core(cu_seqlens, state_slots,
        has_initial_state, cuts, *rows) -> [T, ...], rows being [T, ...] per-token inputs and cuts the
        keyword arguments (snap_pos, snap_slots) that make its kernels write the snapshots (empty without)."""
        cuts = {} if self.snap_pos is None else {"snap_pos": self.snap_pos, "snap_slots": self.snap_slots}
        return core(self.cu_seqlens, self.state_slots, self.has_initial_state, cuts, *rows)


def device_index(values: list[int], device: torch.device | str) -> torch.Tensor:
    """values as an int64 index [len(values)] on `device`, copied from pageable memory without waiting for the
    device (CUDA stages the values at once; the copy is queued on the stream)."""
    return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)
