"""Split the memory budget into state slots and KV pages, and say so.

budget = what the device can give the pools: on CUDA, free memory after weights and a
profiled warm-up minus the (1 - mem_fraction_static) reserve; on CPU, mem_fraction_static of
available RAM. Running slots are sized first (each running request needs one), the same with the
prefix cache as without it: a cache that cut the running slots would make every workload that shares
nothing slower (Nemotron-H-8B's 97 MiB states on one H100: 125 running slots with the cache against 256
without cost 28 % of the throughput of 256 unrelated prompts). With the cache, the memory the running
slots leave is split between snapshots and KV pages at `mamba_full_memory_ratio` (snapshot memory over
KV memory), at most one snapshot per KV page; or `max_mamba_cache_size` sets the state slots in all
(running + snapshots). Pages take the rest.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from hybrid_sgl.config import ModelConfig

logger = logging.getLogger(__name__)

MAX_RUNNING_GPU = 256
MAX_RUNNING_CPU = 32
STATE_SHARE = 0.5  # at most this share of the budget goes to running slots when sizing them by default


@dataclass(frozen=True)
class StateShapes:
    num_layers: int
    conv_shape: tuple[int, int]
    conv_dtype: torch.dtype
    ssm_shape: tuple[int, ...]
    ssm_dtype: torch.dtype


@dataclass(frozen=True)
class MemoryPlan:
    budget_bytes: int
    state_bytes_per_request: int
    kv_bytes_per_token: int
    max_running_requests: int
    page_size: int
    num_pages: int
    context_length: int
    num_snapshots: int = 0
    draft_rows_per_request: int = 0  # state rows each running request keeps for verify-step cuts (speculative)

    @property
    def max_total_tokens(self) -> int:
        return self.num_pages * self.page_size

    def describe(self) -> str:
        return (f"memory plan: budget {self.budget_bytes / 2**30:.2f} GiB"
                f" | state {self.state_bytes_per_request / 2**20:.2f} MiB/request"
                f" x {self.max_running_requests} requests"
                + (f" (+ {self.draft_rows_per_request} verify rows each)" if self.draft_rows_per_request else "") +
                f" | snapshots {self.num_snapshots} x {self.state_bytes_per_request / 2**20:.2f} MiB"
                f" | KV {self.kv_bytes_per_token} B/token x {self.max_total_tokens} tokens"
                f" ({self.num_pages} pages of {self.page_size}) | context length {self.context_length}")


def plan_memory(*, config: ModelConfig, state: StateShapes | None, kv_dtype: torch.dtype, budget_bytes: int,
                on_gpu: bool, page_size: int, context_length: int, max_running_requests: int | None,
                max_total_tokens: int | None, prefix_cache: bool = False, mamba_full_memory_ratio: float = 0.9,
                max_mamba_cache_size: int | None = None, extra_kv_layers: int = 0,
                draft_rows_per_request: int = 0) -> MemoryPlan:
    """extra_kv_layers: KV layers beside the config's (the MTP draft layer); draft_rows_per_request: state
    rows each running request also needs (the verify step's cuts under speculative decoding)."""
    from hybrid_sgl.memory.kv_pool import KVPool
    from hybrid_sgl.memory.state_pool import StatePool

    attn = config.attention
    kv_per_token = KVPool.bytes_per_token(len(config.kv_layers) + extra_kv_layers, attn.num_kv_heads,
                                          attn.head_dim, kv_dtype)
    state_per_req = 0
    if state is not None:
        state_per_req = StatePool.bytes_per_slot(state.num_layers, state.conv_shape, state.conv_dtype,
                                                 state.ssm_shape, state.ssm_dtype)
    per_running = state_per_req * (1 + draft_rows_per_request)
    running = max_running_requests
    if running is None:
        cap = MAX_RUNNING_GPU if on_gpu else MAX_RUNNING_CPU
        running = cap if per_running == 0 else min(cap, int(budget_bytes * STATE_SHARE) // per_running)
    if running < 1:
        raise ValueError(f"not enough memory for one request: state needs {state_per_req} bytes per request, "
                         f"the budget is {budget_bytes} bytes; raise --mem-fraction-static or use a smaller model")
    snapshots = 0
    if prefix_cache and state_per_req:
        if max_mamba_cache_size is not None:
            if max_mamba_cache_size < running:
                raise ValueError(f"--max-mamba-cache-size {max_mamba_cache_size} is below the {running} running "
                                 "requests' state slots; raise it or lower --max-running-requests")
            snapshots = max_mamba_cache_size - running
        else:  # what the running slots leave, split with the KV pages at the ratio
            spare = max(0, budget_bytes - running * per_running)
            snapshots = int(spare * mamba_full_memory_ratio / (1 + mamba_full_memory_ratio)) // state_per_req
    left = budget_bytes - running * per_running - snapshots * state_per_req
    if left <= 0:
        raise ValueError(f"{running} running slots + {snapshots} snapshots of {state_per_req} bytes leave no room "
                         f"for KV pages in a {budget_bytes}-byte budget; lower --max-mamba-cache-size")
    tokens = left // max(kv_per_token, 1)
    if attn is not None and config.kv_layers:  # one layer's K (or V) must stay indexable with int32 offsets
        tokens = min(tokens, (2**31 - 1) // (attn.num_kv_heads * attn.head_dim) - page_size)
    per_request = -(-context_length // page_size) * page_size  # whole pages
    tokens = min(tokens, running * per_request)  # more could never be used at once
    if max_total_tokens is not None:
        tokens = min(tokens, max_total_tokens)
    num_pages = tokens // page_size
    if num_pages < 1:
        raise ValueError(f"no room for KV pages: {running} requests x {state_per_req} bytes of state leave "
                         f"{left} bytes of a {budget_bytes}-byte budget; lower --max-running-requests or "
                         "raise --mem-fraction-static")
    if max_mamba_cache_size is None:
        snapshots = min(snapshots, num_pages)  # more could hardly be used: each needs its own prefix
    if prefix_cache and state_per_req and snapshots == 0:
        logger.warning("the prefix cache has no snapshot slot (%d running requests take the state memory): no "
                       "prefix of the recurrent layers can be reused; lower --max-running-requests or raise "
                       "--mamba-full-memory-ratio or --max-mamba-cache-size", running)
    return MemoryPlan(budget_bytes=budget_bytes, state_bytes_per_request=state_per_req,
                      kv_bytes_per_token=kv_per_token, max_running_requests=running, page_size=page_size,
                      num_pages=num_pages, context_length=min(context_length, num_pages * page_size),
                      num_snapshots=snapshots, draft_rows_per_request=draft_rows_per_request if state_per_req else 0)


def pool_budget_bytes(*, device: torch.device, mem_fraction_static: float, activation_bytes: int = 0) -> int:
    """What the pools may take. On CUDA: the memory free after the weights, less the
    (1 - mem_fraction_static) share of the device kept in reserve and the profiled activations; on
    CPU: mem_fraction_static of the available RAM."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free - total * (1 - mem_fraction_static) - activation_bytes)
    return int(available_ram_bytes() * mem_fraction_static)


def available_ram_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("MemAvailable not found in /proc/meminfo")
