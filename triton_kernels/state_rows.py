"""Masked copies of state-pool rows, decided on the device: row src[i] -> row dst[i] of every layer where
flags[i] != 0, nothing where it is 0 (a program of an unflagged pair returns at once). A chained
speculative iteration (hybrid_sgl/runner/spec_chain.py) rolls back only the rows that rejected a draft, and
which those are is known on the device only: torch would need the host (to compact the indices) or copy
every row, whose state is tens of MiB on real shapes.
"""

import torch
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.host_math import cdiv

BLOCK = 2048


def copy_state_rows_ref(*, state: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, flags: torch.Tensor) -> None:
    """state [L, rows, ...]; src, dst, flags [n] int64 on its device (dst distinct where flagged)."""
    keep = flags == 0
    state.index_copy_(1, dst, state.index_select(1, torch.where(keep, dst, src)))


@cached_launch
@triton.jit
def _copy_rows_kernel(state, src, dst, flags, layer_stride, row_elems, BLOCK: tl.constexpr):
    i, layer, c = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if tl.load(flags + i) != 0:
        o = c * BLOCK + tl.arange(0, BLOCK)
        m = o < row_elems
        base = state + layer.to(tl.int64) * layer_stride
        s, d = tl.load(src + i), tl.load(dst + i)
        x = tl.load(base + s * row_elems + o, mask=m)
        tl.store(base + d * row_elems + o, x, mask=m)


def copy_state_rows(*, state: torch.Tensor, src: torch.Tensor, dst: torch.Tensor, flags: torch.Tensor) -> None:
    """copy_state_rows_ref in one launch; state contiguous."""
    assert state.is_contiguous(), "the state tensor is copied as [layers, rows, elements]"
    n, layers, rows = src.shape[0], state.shape[0], state.shape[1]
    if n == 0 or state.numel() == 0:
        return
    row_elems = state[0, 0].numel()
    _copy_rows_kernel[(n, layers, cdiv(row_elems, BLOCK))](state, src, dst, flags, rows * row_elems, row_elems,
                                                          BLOCK=BLOCK)
