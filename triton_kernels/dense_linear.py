"""16-bit linear layers at decode sizes: cuBLAS or our few-rows tensor-core kernel
(fp8_weight_only.py: dense_few_rows_gemm), whichever runs the shape faster.

cuBLAS streams some narrow weights (few output columns, long K) far below the copy bandwidth, where
the few-rows kernel's per-shape column tiles and K splits keep every SM reading. The choice is timed
once per row bucket (the next power of two) at the bucket's rows (fastest.py): the decode graphs'
warm-ups time every bucket, so that a short prefill later finds its answer instead of stalling.
An eager step (no CUDA graph: `--disable-cuda-graph`, tensor parallelism, shapes above the graphs) runs
cuBLAS whatever the timing said: at decode sizes such a step waits on its host, and one few-rows launch
costs more host time than `F.linear` (its argument checks, scratch and split-K counters, an autotuned
launch), so a faster kernel on the device makes the step slower (bench/README.md).
HYBRID_SGL_FEW_ROWS_GEMM at start: 0 runs every linear on cuBLAS, 2 lets eager steps run the few-rows
kernel too (both to compare the ways' host and device time)."""

import os
import threading
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from triton_kernels.fastest import chosen, fastest
from triton_kernels.fp8_weight_only import DENSE_MAX_ROWS, dense_few_rows_gemm
from triton_kernels.host_math import next_power_of_2

FEW_ROWS = os.environ.get("HYBRID_SGL_FEW_ROWS_GEMM", "1")
if FEW_ROWS not in ("0", "1", "2"):
    raise ValueError(f"HYBRID_SGL_FEW_ROWS_GEMM={FEW_ROWS}: 0, 1 or 2")


class _Step(threading.local):
    eager = False  # inside eager_step, in this thread


_step = _Step()


@contextmanager
def eager_step():
    """Around an eager step's forward: its linears run cuBLAS (unless HYBRID_SGL_FEW_ROWS_GEMM=2)."""
    outer, _step.eager = _step.eager, True
    try:
        yield
    finally:
        _step.eager = outer


def dense_linear_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [..., K]; weight: [N, K]; bias: [N] or None -> [..., N] (F.linear)."""
    return F.linear(x, weight, bias)


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """dense_linear_ref on CUDA. Up to DENSE_MAX_ROWS rows of 16-bit x (weight in x's dtype) run the few-rows
    kernel where it timed faster than cuBLAS by 5 %, outside eager steps; everything else runs cuBLAS."""
    rows = x.reshape(-1, x.shape[-1])
    if not (_few_rows_allowed() and 0 < rows.shape[0] <= DENSE_MAX_ROWS and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and _ours_is_faster(rows, weight, bias)):
        return F.linear(x, weight, bias)
    return dense_few_rows_gemm(x=rows, weight=weight, bias=bias).view(*x.shape[:-1], weight.shape[0])


def _few_rows_allowed() -> bool:
    return FEW_ROWS == "2" or (FEW_ROWS == "1" and not _step.eager)


def dense_linear_choice(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> str | None:
    """"cublas" or "ours" once dense_linear has timed x's shape and row bucket, else None."""
    return chosen(_choice_key(x.reshape(-1, x.shape[-1]), weight, bias))


def _choice_key(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    return ("dense_linear", *weight.shape, next_power_of_2(rows.shape[0]), rows.dtype, rows.device,
            bias is not None)


def _ours_is_faster(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    def runs() -> dict:  # on random rows of the bucket's count
        x = torch.randn(next_power_of_2(rows.shape[0]), rows.shape[1], dtype=rows.dtype, device=rows.device)
        return {"cublas": lambda: F.linear(x, weight, bias),
                "ours": lambda: dense_few_rows_gemm(x=x, weight=weight, bias=bias)}

    return fastest(_choice_key(rows, weight, bias), runs, margin=0.95) == "ours"
