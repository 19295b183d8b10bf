"""FP8-weight linear layers at decode sizes (up to WEIGHT_ONLY_MAX_ROWS rows): the weight-only GEMMs
(fp8_weight_only.py), or from W8A8_MIN_ROWS rows on CUDA the W8A8 GEMM (fp8_gemm.py), whichever runs the shape faster.

At a few rows the weight-only kernels win: the layer's time is its weight read, and they leave the
activations unquantized. From a few dozen rows on, widening e4m3 to 16 bits in registers costs more than
the tensor cores' time, and on some shapes the e4m3 x e4m3 GEMM (activations quantized per 128-wide block,
cuBLAS or our Triton kernel) is faster. The choice is timed once per row bucket (the next power of two) on
random rows of the bucket's count (fastest.py), as dense_linear.py times its own: the decode graphs'
warm-ups time every bucket. The weight-only path is the incumbent, kept unless W8A8 takes under
W8A8_MARGIN of its time, because its result is the more exact one (its products are those of the
unquantized activations). Off CUDA the weight-only path always serves (nothing to time), so CPU runs
keep the float32 results the default model's tests compare."""

import functools

import torch

from triton_kernels.fastest import chosen, fastest
from triton_kernels.fp8_gemm import _cublas_takes, fp8_gemm
from triton_kernels.fp8_weight_only import (
    WEIGHT_ONLY_MAX_ROWS,
    fp8_weight_only_gated_gemm,
    fp8_weight_only_gemm,
)
from triton_kernels.host_math import next_power_of_2
from triton_kernels.norms import silu_and_mul

W8A8_MIN_ROWS = 17  # below this the weight-only kernels were faster on every 9B and 35B shape
W8A8_MARGIN = 0.9


def fp8_few_rows_gemm(*, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                      bias: torch.Tensor | None = None) -> torch.Tensor:
    """fp8_weight_only_gemm's contract (x [M, K] with M <= WEIGHT_ONLY_MAX_ROWS, weight [N, K] e4m3,
    weight_scale_inv [ceil(N/128), ceil(K/128)] float32, bias [N] or None -> [M, N] in x's dtype), through
    the W8A8 GEMM where that timed faster for the shape and row bucket."""
    path = _path(x, weight, weight_scale_inv, bias)
    if path == "weight-only":
        return fp8_weight_only_gemm(x=x, weight=weight, weight_scale_inv=weight_scale_inv, bias=bias)
    return _w8a8(path, x, weight, weight_scale_inv, bias)


def fp8_few_rows_gated_gemm(*, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                            bias: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up of fp8_few_rows_gemm's result: a gated MLP's gate_up (weight [2I, K], rows [gate; up])
    -> [M, I]. The weight-only path fuses the activation where its GEMV serves (fp8_weight_only_gated_gemm)."""
    path = _path(x, weight, weight_scale_inv, bias)
    if path == "weight-only":
        return fp8_weight_only_gated_gemm(x=x, weight=weight, weight_scale_inv=weight_scale_inv, bias=bias)
    return silu_and_mul(gate_up=_w8a8(path, x, weight, weight_scale_inv, bias))


def _w8a8(path: str, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
          bias: torch.Tensor | None) -> torch.Tensor:
    return fp8_gemm(x=x, weight=weight, weight_scale_inv=weight_scale_inv, bias=bias, cublas=path == "w8a8 cublas")


def fp8_few_rows_choice(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> str | None:
    """"weight-only", "w8a8 cublas" or "w8a8 triton" once x's shape and row bucket were timed, else None."""
    return chosen(_choice_key(x, weight, bias))


def _choice_key(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    return ("fp8_few_rows", *weight.shape, next_power_of_2(x.shape[0]), x.dtype, x.device, bias is not None)


def _path(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor, bias: torch.Tensor | None) -> str:
    m = x.shape[0]
    assert m <= WEIGHT_ONLY_MAX_ROWS, f"{m} rows: use fp8_gemm above {WEIGHT_ONLY_MAX_ROWS}"
    if not x.is_cuda or m < W8A8_MIN_ROWS:
        return "weight-only"

    def runs() -> dict:  # on random rows of the bucket's count
        rows = torch.randn(next_power_of_2(m), x.shape[1], dtype=x.dtype, device=x.device)
        kw = dict(x=rows, weight=weight, weight_scale_inv=weight_scale_inv, bias=bias)
        paths = {"weight-only": functools.partial(fp8_weight_only_gemm, **kw),
                 "w8a8 triton": functools.partial(fp8_gemm, cublas=False, **kw)}
        if x.dtype != torch.float32 and _cublas_takes(weight.shape[0], x.shape[1], x.device):
            paths["w8a8 cublas"] = functools.partial(fp8_gemm, cublas=True, **kw)
        return paths

    return fastest(_choice_key(x, weight, bias), runs, margin=W8A8_MARGIN) or "weight-only"
