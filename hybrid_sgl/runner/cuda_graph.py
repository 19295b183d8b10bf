"""CUDA graphs of the decode step (model forward + logits), one per captured batch size.

Decode launches hundreds of small kernels per step; replaying a captured graph removes their
launch cost. A batch of B requests runs in the graph of the smallest captured size >= B; the
extra rows point at the pad slot, a negative KV slot (store skipped) and seq_len 0 (attention
returns zeros), so they touch no real request's state.
"""

from __future__ import annotations

import logging
import time

import torch

from hybrid_sgl.memory.allocator import Allocator
from hybrid_sgl.memory.kv_pool import KVPool
from hybrid_sgl.memory.state_pool import StatePool
from hybrid_sgl.runner.forward_batch import ForwardBatch, ForwardMode

logger = logging.getLogger(__name__)


def capture_sizes(max_bs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, 257, 16)) + list(range(288, max_bs + 1, 32))
    return sorted({s for s in sizes if s < max_bs} | {max_bs})


class DecodeGraphs:
    def __init__(self, *, model: torch.nn.Module, allocator: Allocator, kv_pool: KVPool | None,
                 state_pool: StatePool | None, max_bs: int, device: torch.device):
        self.model = model
        self.allocator = allocator
        self.sizes = capture_sizes(max_bs)
        self.max_bs = self.sizes[-1]
        width = allocator.max_pages_per_request
        self.fb = ForwardBatch(
            mode=ForwardMode.DECODE,
            input_ids=torch.zeros(self.max_bs, dtype=torch.int64, device=device),
            positions=torch.zeros(self.max_bs, dtype=torch.int64, device=device),
            seq_lens=torch.zeros(self.max_bs, dtype=torch.int32, device=device),
            state_slots=torch.full((self.max_bs,), allocator.pad_slot, dtype=torch.int32, device=device),
            block_table=torch.full((self.max_bs, width), allocator.pad_page, dtype=torch.int32, device=device),
            slot_mapping=torch.full((self.max_bs,), -1, dtype=torch.int64, device=device),
            cu_seqlens=torch.arange(self.max_bs + 1, dtype=torch.int32, device=device),
            has_initial_state=torch.ones(self.max_bs, dtype=torch.bool, device=device),
            kv_pool=kv_pool, state_pool=state_pool)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}

    def _view(self, bs: int) -> ForwardBatch:
        f = self.fb
        return ForwardBatch(mode=ForwardMode.DECODE, input_ids=f.input_ids[:bs], positions=f.positions[:bs],
                            seq_lens=f.seq_lens[:bs], state_slots=f.state_slots[:bs], block_table=f.block_table[:bs],
                            slot_mapping=f.slot_mapping[:bs], cu_seqlens=f.cu_seqlens[:bs + 1],
                            has_initial_state=f.has_initial_state[:bs], kv_pool=f.kv_pool, state_pool=f.state_pool)

    def _forward(self, fb: ForwardBatch) -> torch.Tensor:
        return self.model.compute_logits(self.model(fb))

    @torch.inference_mode()
    def capture(self) -> None:
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        for bs in reversed(self.sizes):  # largest first, so smaller graphs reuse its memory
            fb = self._view(bs)
            with torch.cuda.stream(stream):
                for _ in range(2):  # compile / autotune outside the capture
                    self._forward(fb)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self.logits[bs] = self._forward(fb)
            self.graphs[bs] = graph
        torch.cuda.synchronize()
        logger.info("captured decode CUDA graphs for batch sizes %s in %.1f s", self.sizes,
                    time.perf_counter() - start)

    def fits(self, batch_size: int) -> bool:
        return batch_size <= self.max_bs

    def run(self, fb: ForwardBatch) -> torch.Tensor:
        """fb: a real decode batch of B rows. Returns logits [B, V] (valid until the next run)."""
        b = fb.batch_size
        bs = next(s for s in self.sizes if s >= b)
        f = self.fb
        f.input_ids[:b].copy_(fb.input_ids)
        f.positions[:b].copy_(fb.positions)
        f.seq_lens[:b].copy_(fb.seq_lens)
        f.state_slots[:b].copy_(fb.state_slots)
        f.slot_mapping[:b].copy_(fb.slot_mapping)
        torch.index_select(self.allocator.page_table, 0, fb.state_slots, out=f.block_table[:b])
        if bs > b:  # padding rows
            f.seq_lens[b:bs].zero_()
            f.state_slots[b:bs].fill_(self.allocator.pad_slot)
            f.slot_mapping[b:bs].fill_(-1)
        self.graphs[bs].replay()
        return self.logits[bs][:b]
