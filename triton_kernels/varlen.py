"""Chunk indexing for packed varlen batches, without a host sync.

Sequence n spans tokens [cu_seqlens[n], cu_seqlens[n+1]) and is cut into chunks of BT tokens
that never straddle sequences. Chunk i_t of sequence n gets the *virtual index*

    cu_seqlens[n] // BT + n + i_t

which is unique and below T // BT + N for a batch of N sequences and T tokens (a chunk-aligned
sequence start leaves no hole, every other start at most one). A kernel launched over
`num_virtual_chunks(T, N)` programs finds its (sequence, chunk) with `locate_chunk` and exits
when its index is a hole; per-chunk buffers are indexed by the virtual index directly.

`snapshot_cuts` reads the per-sequence snapshot cuts of such a batch on the host, for the torch references.
"""

import torch
import triton
import triton.language as tl


def num_virtual_chunks(num_tokens: int, num_seqs: int, chunk: int) -> int:
    return num_tokens // chunk + num_seqs


@triton.jit
def locate_chunk(cu_seqlens, i_c, N, BT: tl.constexpr, BLOCK_N: tl.constexpr):
    """Virtual chunk i_c -> (i_n, i_t, bos, eos): the chunk's sequence, its index in that
    sequence, and the sequence bounds. The chunk is a hole when i_t * BT >= eos - bos."""
    count = 0
    for start in range(0, N, BLOCK_N):
        o_n = start + tl.arange(0, BLOCK_N)
        m_n = o_n < N
        b_bos = tl.load(cu_seqlens + o_n, mask=m_n, other=0).to(tl.int64)
        count += tl.sum((m_n & (b_bos // BT + o_n <= i_c)).to(tl.int32), 0)
    i_n = count - 1  # the first chunk of sequence 0 has index 0, so count >= 1
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    i_t = i_c - (bos // BT + i_n)
    return i_n, i_t, bos, eos


def snapshot_cuts(snap_pos: torch.Tensor | None, snap_slots: torch.Tensor | None,
                  bounds: list[int]) -> list[dict[int, int]]:
    """Per sequence, {tokens p: snapshot slot} from the [num_seqs, cuts] rows (-1 is no cut), each
    row checked: valid cuts first, strictly ascending, within 1..length."""
    cuts: list[dict[int, int]] = [{} for _ in range(len(bounds) - 1)]
    if snap_pos is None:
        return cuts
    for i, (row, slots) in enumerate(zip(snap_pos.tolist(), snap_slots.tolist())):
        valid = [p for p in row if p != -1]
        length = bounds[i + 1] - bounds[i]
        assert row[: len(valid)] == valid == sorted(set(valid)), f"snap_pos row {i} {row}: cuts first, ascending"
        assert all(1 <= p <= length for p in valid), f"snap_pos row {i} {row}: cuts within 1..{length}"
        cuts[i] = dict(zip(valid, slots))
    return cuts
