"""CUDA graphs of the decode step (input preparation + model forward + logits), one per captured
batch size.

Decode launches hundreds of small kernels per step; replaying a captured graph removes their
launch cost. The host side of a step is one copy of a pinned [3, B] int64 buffer (token ids,
positions, state slots; two such buffers in turn, since a launched step's copy may still wait in
the stream while the host fills the next step's); the graph derives everything else on the device:
seq_lens, the block table (a gather of the allocator's page table by slot) and the KV slot of each
new token. A batch of B requests runs in the graph of the smallest captured size >= B; the extra
rows carry the pad slot, so they get seq_len 0 (attention returns zeros), KV slot -1 (store
skipped) and recurrent kernels skip them: they touch no real request's state.
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
                 state_pool: StatePool | None, max_bs: int, device: torch.device, take_prev_ids: bool = False):
        self.model = model
        self.allocator = allocator
        self.kv_pool = kv_pool
        self.state_pool = state_pool
        self.sizes = capture_sizes(max_bs)
        self.max_bs = self.sizes[-1]
        # [turn, rows: token ids, positions, state slots, B]: steps use the two in turn (overlapped decode has one
        # step launched, its copy maybe still queued, while the host fills the next)
        self.host_inputs = torch.zeros((2, 3, self.max_bs), dtype=torch.int64, pin_memory=device.type == "cuda")
        self.host_view = self.host_inputs.numpy()
        self.turn = 0
        self.inputs = torch.zeros((3, self.max_bs), dtype=torch.int64, device=device)
        self.inputs[2].fill_(allocator.pad_slot)
        # overlapped decode: a token id -(j + 1) means prev_ids[j], sampled by the previous step on the device
        self.prev_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device) if take_prev_ids else None
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}

    def _batch(self, bs: int) -> ForwardBatch:
        """The decode ForwardBatch of the first `bs` input rows, computed on the device."""
        a = self.allocator
        ids, positions, slots = self.inputs[:, :bs]
        if self.prev_ids is not None:
            ids = torch.where(ids >= 0, ids, self.prev_ids[(-ids - 1).clamp(min=0)])
        valid = slots != a.pad_slot
        block_table = a.page_table.index_select(0, slots)
        page = block_table.gather(1, (positions // a.page_size)[:, None]).squeeze(1).long()
        slot_mapping = torch.where(valid, page * a.page_size + positions % a.page_size, -1)
        return ForwardBatch(mode=ForwardMode.DECODE, input_ids=ids, positions=positions,
                            seq_lens=torch.where(valid, positions + 1, 0).int(), state_slots=slots.int(),
                            block_table=block_table, slot_mapping=slot_mapping,
                            cu_seqlens=torch.arange(bs + 1, dtype=torch.int32, device=ids.device),
                            has_initial_state=valid, kv_pool=self.kv_pool, state_pool=self.state_pool)

    def _forward(self, bs: int) -> torch.Tensor:
        return self.model.compute_logits(self.model(self._batch(bs)))

    @torch.inference_mode()
    def capture(self) -> None:
        start = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        # the warm-ups run on `stream`: it must first wait for what the caller's stream still has queued (the
        # inputs' zero and pad-slot fills above, the pools'), or they may read stale memory as token ids and slots
        # (a new torch stream does not wait for the caller's: bench/graph_wait_probe.py, on the H200)
        stream.wait_stream(torch.cuda.current_stream())
        for bs in reversed(self.sizes):  # largest first, so smaller graphs reuse its memory
            with torch.cuda.stream(stream):
                for _ in range(2):  # compile / autotune outside the capture
                    self._forward(bs)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                self.logits[bs] = self._forward(bs)
            self.graphs[bs] = graph
        torch.cuda.synchronize()
        logger.info("captured decode CUDA graphs for batch sizes %s in %.1f s", self.sizes,
                    time.perf_counter() - start)

    def fits(self, batch_size: int) -> bool:
        return batch_size <= self.max_bs

    def run(self, token_ids: list[int], positions: list[int], slots: list[int],
            prev_ids: torch.Tensor | None = None) -> torch.Tensor:
        """One decode step of B = len(token_ids) requests. Returns logits [B, V] (valid until the
        next run). prev_ids: the previous step's sampled ids on the device, for tokens -(j + 1)."""
        b = len(token_ids)
        if prev_ids is not None:
            self.prev_ids[:prev_ids.shape[0]].copy_(prev_ids)
        bs = next(s for s in self.sizes if s >= b)
        self.turn ^= 1
        host = self.host_view[self.turn]
        host[0, :b], host[1, :b], host[2, :b] = token_ids, positions, slots
        host[:, b:bs] = 0
        host[2, b:bs] = self.allocator.pad_slot
        self.inputs[:, :bs].copy_(self.host_inputs[self.turn, :, :bs], non_blocking=True)
        self.graphs[bs].replay()
        return self.logits[bs][:b]
