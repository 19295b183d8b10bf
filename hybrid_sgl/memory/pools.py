"""The pools of one rank, built from its memory plan: state slots, KV pages and the allocator.

The plan (memory_plan.py) says how many slots, pages and snapshots fit; `build_pools` turns it into
tensors of this rank's shapes. The Engine hands the result to the scheduler and the prefix cache;
the runner keeps it for its step inputs and graphs. Dropping the Pools (and what holds them) frees
the memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from hybrid_sgl.memory.allocator import Allocator
from hybrid_sgl.memory.kv_pool import KVPool
from hybrid_sgl.memory.memory_plan import MemoryPlan, StateShapes
from hybrid_sgl.memory.state_pool import StatePool


@dataclass(frozen=True)
class KVShapes:
    num_layers: int  # full-attention layers
    num_kv_heads: int  # this rank's
    head_dim: int
    dtype: torch.dtype


class Pools(NamedTuple):
    state_pool: StatePool | None  # None for a model without recurrent layers
    kv_pool: KVPool | None  # None for a model without full-attention layers
    allocator: Allocator


def build_pools(plan: MemoryPlan, *, state: StateShapes | None, kv: KVShapes | None, device: torch.device,
                classes: tuple[type[StatePool], type[KVPool]] = (StatePool, KVPool)) -> Pools:
    """Pools for `plan`: a state slot per running request plus the snapshots, the KV pages, and the
    allocator over both (one request at most plan.context_length tokens). classes: the (state, KV)
    pool classes (tensor-parallel rank 0 passes ones that record their copies for the other ranks)."""
    state_cls, kv_cls = classes
    state_pool = None
    if state is not None:
        state_pool = state_cls(num_layers=state.num_layers, num_slots=plan.max_running_requests,
                               conv_shape=state.conv_shape, conv_dtype=state.conv_dtype, ssm_shape=state.ssm_shape,
                               ssm_dtype=state.ssm_dtype, device=device, num_snapshots=plan.num_snapshots,
                               num_draft_rows=plan.max_running_requests * plan.draft_rows_per_request)
    kv_pool = None
    if kv is not None:
        kv_pool = kv_cls(num_layers=kv.num_layers, num_pages=plan.num_pages, page_size=plan.page_size,
                         num_kv_heads=kv.num_kv_heads, head_dim=kv.head_dim, dtype=kv.dtype, device=device)
    allocator = Allocator(num_slots=plan.max_running_requests, num_pages=plan.num_pages, page_size=plan.page_size,
                          max_pages_per_request=-(-plan.context_length // plan.page_size), device=device,
                          num_snapshots=plan.num_snapshots, draft_rows_per_slot=plan.draft_rows_per_request)
    return Pools(state_pool, kv_pool, allocator)
