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
              state_pool: StatePool | None, device: torch.device,
              prev_ids: torch.Tensor | None = None) -> ForwardBatch:
        """token_runs[i]: the new tokens of request i, which starts at position prefix_lens[i]. A token
        -(j + 1) stands for prev_ids[j], a token the previous step sampled and the host has not seen
        yet (overlapped decode)."""
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
        return ForwardBatch(mode=mode, input_ids=input_ids, positions=dev_positions, seq_lens=to(seq_lens),
                            state_slots=dev_slots, block_table=block_table, slot_mapping=slot_mapping,
                            cu_seqlens=to(cu.to(torch.int32)), has_initial_state=to(starts > 0), kv_pool=kv_pool,
                            state_pool=state_pool)
