"""ForwardBatch: everything one model step needs, built once per step, read by every layer."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from hybrid_sgl.memory.kv_pool import KVPool
from hybrid_sgl.memory.state_pool import StatePool


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


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill / chunked prefill: varlen token runs per request
    DECODE = "decode"  # one token per request


@dataclass
class ForwardBatch:
    mode: ForwardMode
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    seq_lens: torch.Tensor  # [B] int32, tokens in cache after this step (prefix + new)
    state_slots: torch.Tensor  # [B] int32, state slot (= page-table row) of each request
    block_table: torch.Tensor  # [B, max_pages] int32
    slot_mapping: torch.Tensor  # [T] int64, flat KV index (page * page_size + offset) of each new token
    cu_seqlens: torch.Tensor  # [B+1] int32, token runs of the requests (decode: 0..B)
    has_initial_state: torch.Tensor  # [B] bool, request continues from state in its slot
    kv_pool: KVPool | None
    state_pool: StatePool | None
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

    @staticmethod
    def build(*, mode: ForwardMode, token_runs: list[list[int]], prefix_lens: list[int], slots: list[int],
              page_table: torch.Tensor, page_size: int, kv_pool: KVPool | None,
              state_pool: StatePool | None, device: torch.device,
              prev_ids: torch.Tensor | None = None,
              snapshots: list[list[tuple[int, int]]] | None = None) -> ForwardBatch:
        """token_runs[i]: the new tokens of request i, which starts at position prefix_lens[i]. A token
        -(j + 1) stands for prev_ids[j], a token the previous step sampled and the host has not seen
        yet (overlapped decode). snapshots[i]: (position strictly inside run i, snapshot index) pairs:
        the recurrent state at that position is copied there during the step."""
        lens = torch.tensor([len(run) for run in token_runs], dtype=torch.int64)
        starts = torch.tensor(prefix_lens, dtype=torch.int64)
        cu = torch.zeros(len(token_runs) + 1, dtype=torch.int64)
        cu[1:] = lens.cumsum(0)
        row = torch.repeat_interleave(torch.arange(len(token_runs)), lens)  # [T] request of each token
        positions = starts[row] + torch.arange(int(cu[-1])) - cu[:-1][row]
        input_ids = torch.tensor([t for run in token_runs for t in run], dtype=torch.int64)
        seq_lens = (starts + lens).to(torch.int32)
        to = lambda t: t.to(device, non_blocking=True)  # noqa: E731
        dev_positions, dev_slots = to(positions), to(torch.tensor(slots, dtype=torch.int32))
        max_pages = -(-int(seq_lens.max()) // page_size)
        block_table = page_table[dev_slots.long(), :max_pages]
        pages = block_table[to(row), dev_positions // page_size].long()
        slot_mapping = pages * page_size + dev_positions % page_size
        input_ids = to(input_ids)
        if prev_ids is not None:
            input_ids = torch.where(input_ids >= 0, input_ids, prev_ids[(-input_ids - 1).clamp(min=0)])
        rounds = None
        if snapshots and any(snapshots) and state_pool is not None:
            rounds = _rounds(token_runs, prefix_lens, slots, snapshots, cu.tolist(), device)
        return ForwardBatch(mode=mode, input_ids=input_ids, positions=dev_positions, seq_lens=to(seq_lens),
                            state_slots=dev_slots, block_table=block_table, slot_mapping=slot_mapping,
                            cu_seqlens=to(cu.to(torch.int32)), has_initial_state=to(starts > 0), kv_pool=kv_pool,
                            state_pool=state_pool, rounds=rounds)


def _rounds(token_runs, prefix_lens, slots, snapshots, cu: list[int], device) -> list[RecurrentRound]:
    """Cut each run at its snapshot positions; round r takes every run's r-th segment."""
    segments = []  # per run: [(first row, end row, snapshot index or None)]
    for i, run in enumerate(token_runs):
        cuts = sorted(snapshots[i]) if snapshots[i] else []
        bounds, start = [], cu[i]
        for pos, index in cuts:
            row = cu[i] + pos - prefix_lens[i]
            assert cu[i] < row < cu[i] + len(run), f"snapshot position {pos} is not inside run {i}"
            bounds.append((start, row, index))
            start = row
        bounds.append((start, cu[i] + len(run), None))
        segments.append(bounds)
    rounds = []
    for r in range(max(len(b) for b in segments)):
        rows, lens, round_slots, init, src, dst = [], [0], [], [], [], []
        for i, bounds in enumerate(segments):
            if r >= len(bounds):
                continue
            first, end, index = bounds[r]
            rows.extend(range(first, end))
            lens.append(lens[-1] + end - first)
            round_slots.append(slots[i])
            init.append(r > 0 or prefix_lens[i] > 0)
            if index is not None:
                src.append(slots[i])
                dst.append(index)
        to = lambda values, dtype: torch.tensor(values, dtype=dtype).to(device, non_blocking=True)  # noqa: E731
        rounds.append(RecurrentRound(rows=to(rows, torch.int64), cu_seqlens=to(lens, torch.int32),
                                     state_slots=to(round_slots, torch.int32), has_initial_state=to(init, torch.bool),
                                     snap_src=to(src, torch.int64), snap_dst=to(dst, torch.int64)))
    return rounds
