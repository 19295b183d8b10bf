"""Expert sort for the fused MoE: the T*k (token, slot) assignments a = t * k + j grouped by expert on
the device, with no host sync (CUDA-graph safe). A counting sort: per-chunk histograms, then each chunk
scatters its assignments to expert start + earlier chunks' share + rank in the chunk, ranks from an
in-register sort. The rows of each expert are then contiguous: sorted_assign [T*k], expert_offsets
[E + 1]. The grouped GEMMs (fused_moe.py) walk BLOCK_M-row blocks of those rows and find each block's
expert with `locate_block`; `max_blocks` sizes their grids for any routing."""

import torch
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.host_math import cdiv, next_power_of_2


@cached_launch
@triton.jit
def _expert_count_kernel(topk_ids, counts, M, E, CHUNK: tl.constexpr, NUM_BINS: tl.constexpr):
    """counts[c, e] = assignments c*CHUNK .. c*CHUNK + CHUNK - 1 routed to expert e. Padding lanes
    land in bin NUM_BINS - 1 >= E."""
    i_c = tl.program_id(0)
    o_a = i_c * CHUNK + tl.arange(0, CHUNK)
    b_ids = tl.load(topk_ids + o_a, mask=o_a < M, other=NUM_BINS - 1).to(tl.int32)
    o_e = tl.arange(0, NUM_BINS)
    tl.store(counts + i_c * E + o_e, tl.histogram(b_ids, NUM_BINS), mask=o_e < E)


@cached_launch
@triton.jit
def _expert_sort_kernel(topk_ids, counts, expert_offsets, sorted_assign, M, E, num_chunks,
                        CHUNK: tl.constexpr, NUM_BINS: tl.constexpr, BLOCK_C: tl.constexpr,
                        ONE_CHUNK: tl.constexpr):
    """One program per chunk: scatters the chunk's assignment indices to their expert-sorted
    positions (ties in assignment order, as a stable sort). Program 0 writes expert_offsets."""
    i_c = tl.program_id(0)
    o_e = tl.arange(0, NUM_BINS)
    o_i = tl.arange(0, CHUNK)
    o_a = i_c * CHUNK + o_i
    b_ids = tl.load(topk_ids + o_a, mask=o_a < M, other=NUM_BINS - 1).to(tl.int32)
    b_hist = tl.where(o_e < E, tl.histogram(b_ids, NUM_BINS), 0)
    if ONE_CHUNK:
        b_total = b_hist
        b_before = tl.zeros([NUM_BINS], dtype=tl.int32)
    else:  # totals over all chunks and the share of the chunks before this one
        b_total = tl.zeros([NUM_BINS], dtype=tl.int32)
        b_before = tl.zeros([NUM_BINS], dtype=tl.int32)
        for c0 in range(0, num_chunks, BLOCK_C):
            o_c = c0 + tl.arange(0, BLOCK_C)
            b_cnt = tl.load(counts + o_c[:, None] * E + o_e[None, :],
                            mask=(o_c < num_chunks)[:, None] & (o_e < E)[None, :], other=0)
            b_total += tl.sum(b_cnt, 0)
            b_before += tl.sum(tl.where((o_c < i_c)[:, None], b_cnt, 0), 0)
    b_start = tl.cumsum(b_total, 0) - b_total  # first sorted position of each expert; M at index E
    if i_c == 0:
        tl.store(expert_offsets + o_e, b_start, mask=o_e <= E)
    # sorted position = b_start + b_before + rank in the chunk = b_base[e] + position in the sorted chunk
    b_base = b_start + b_before - (tl.cumsum(b_hist, 0) - b_hist)
    b_key = tl.sort(b_ids * CHUNK + o_i)  # by expert, then by assignment
    b_expert = b_key // CHUNK
    b_dest = tl.gather(b_base, b_expert, 0) + o_i
    tl.store(sorted_assign + b_dest, i_c * CHUNK + b_key % CHUNK, mask=b_expert < E)


@triton.jit
def locate_block(expert_offsets, i_b, E, BLOCK_M: tl.constexpr, NUM_BINS: tl.constexpr):
    """Block i_b of the expert-sorted rows -> (expert, its first row, the expert's end row).
    Each expert owns cdiv(rows, BLOCK_M) consecutive blocks; expert >= E past the last block."""
    o_e = tl.arange(0, NUM_BINS)
    m_e = o_e < E
    b_begin = tl.load(expert_offsets + o_e, mask=m_e, other=0)
    b_end = tl.load(expert_offsets + o_e + 1, mask=m_e, other=0)
    b_blocks = tl.cdiv(b_end - b_begin, BLOCK_M)
    b_blocks_end = tl.cumsum(b_blocks, 0)
    i_e = tl.sum((b_blocks_end <= i_b).to(tl.int32), 0)
    m_sel = o_e == i_e
    row = tl.sum(tl.where(m_sel, b_begin + (i_b - b_blocks_end + b_blocks) * BLOCK_M, 0), 0)
    row_end = tl.sum(tl.where(m_sel, b_end, 0), 0)
    return i_e, row, row_end


def bins_for(num_experts: int) -> int:
    return next_power_of_2(num_experts + 1)  # one spare bin for padding lanes


def sort_by_expert(*, topk_ids: torch.Tensor, num_experts: int, chunk: int | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """topk_ids: [T, k] ints in [0, num_experts). Returns (sorted_assign [T*k] int32: the
    assignment indices t * k + j grouped by expert, ascending within an expert; expert_offsets
    [num_experts + 1] int32: expert e's rows are sorted_assign[offsets[e]:offsets[e + 1]]).
    chunk (a power of two) is the number of assignments one program sorts."""
    num_assign = topk_ids.numel()
    ids = topk_ids.contiguous()
    if chunk is None:
        chunk = min(next_power_of_2(max(num_assign, 16)), 1024 if ids.device.type == "cuda" else 16)
    num_chunks = cdiv(num_assign, chunk)
    num_bins = bins_for(num_experts)
    sorted_assign = torch.empty(num_assign, dtype=torch.int32, device=ids.device)
    expert_offsets = torch.empty(num_experts + 1, dtype=torch.int32, device=ids.device)
    counts = torch.empty((num_chunks, num_experts), dtype=torch.int32, device=ids.device)
    if num_chunks > 1:
        _expert_count_kernel[(num_chunks,)](ids, counts, num_assign, num_experts, CHUNK=chunk, NUM_BINS=num_bins)
    _expert_sort_kernel[(num_chunks,)](
        ids, counts, expert_offsets, sorted_assign, num_assign, num_experts, num_chunks,
        CHUNK=chunk, NUM_BINS=num_bins, BLOCK_C=max(1, min(next_power_of_2(num_chunks), 8192 // num_bins)),
        ONE_CHUNK=num_chunks == 1)
    return sorted_assign, expert_offsets


def max_blocks(num_rows: int, num_experts: int, block_m: int) -> int:
    """Most BLOCK_M-row blocks num_rows rows can need when each expert's rows start a new block:
    n touched experts need at most n + (num_rows - n) // block_m, largest at n = min(E, rows)."""
    touched = min(num_experts, num_rows)
    return touched + (num_rows - touched) // block_m
