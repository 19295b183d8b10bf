"""ForwardBatch: everything one model step needs, built once per step, read by every layer."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from hybrid_sgl.memory.kv_pool import KVPool
from hybrid_sgl.memory.state_pool import StatePool


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

    @property
    def batch_size(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]

    @property
    def is_decode(self) -> bool:
        return self.mode is ForwardMode.DECODE

    @staticmethod
    def build(*, mode: ForwardMode, token_runs: list[list[int]], prefix_lens: list[int], slots: list[int],
              page_table: torch.Tensor, page_size: int, kv_pool: KVPool | None,
              state_pool: StatePool | None, device: torch.device) -> ForwardBatch:
        """token_runs[i]: the new tokens of request i, which starts at position prefix_lens[i]."""
        lens = [len(run) for run in token_runs]
        input_ids = torch.tensor([t for run in token_runs for t in run], dtype=torch.int64)
        positions = torch.cat([torch.arange(p, p + n, dtype=torch.int64) for p, n in zip(prefix_lens, lens)])
        cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
        cu[1:] = torch.tensor(lens, dtype=torch.int32).cumsum(0)
        seq_lens = torch.tensor([p + n for p, n in zip(prefix_lens, lens)], dtype=torch.int32)
        slots_t = torch.tensor(slots, dtype=torch.int32)
        has_init = torch.tensor([p > 0 for p in prefix_lens], dtype=torch.bool)
        max_pages = -(-int(seq_lens.max()) // page_size)
        block_table = page_table[slots_t.to(page_table.device).long(), :max_pages]
        row = torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens))
        page_idx = (positions // page_size).to(page_table.device)
        pages = block_table[row.to(page_table.device), page_idx].long()
        slot_mapping = pages * page_size + (positions % page_size).to(page_table.device)
        to = lambda t: t.to(device, non_blocking=True)  # noqa: E731
        return ForwardBatch(mode=mode, input_ids=to(input_ids), positions=to(positions), seq_lens=to(seq_lens),
                            state_slots=to(slots_t), block_table=block_table, slot_mapping=to(slot_mapping),
                            cu_seqlens=to(cu), has_initial_state=to(has_init), kv_pool=kv_pool,
                            state_pool=state_pool)
