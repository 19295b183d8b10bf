"""Block-scaled FP8 GEMM for many rows (prefill): y = q(x) @ dequant(w)^T, e4m3 x e4m3 on the FP8
tensor cores (twice bf16's rate), float32 accumulation. Formats in fp8_quant.py.

x [M, K] is quantized once, per token and 128-column group (`quantize_activations`), then multiplied
by w [N, K] e4m3: through cuBLAS's block-scaled GEMM (torch's `scaled_mm`, BlockWise1x128 activations
x BlockWise128x128 weights) where this torch build and the shape support it, else through the Triton
kernel below, which scales each 128-wide K tile's partial sum by its activation and weight scales.
Every row is quantized on its own, so a token's result does not depend on its batch.
"""

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import triton.testing

from triton_kernels.cached_launch import cached_launch
from triton_kernels.fp8_quant import (
    FP8_BLOCK,
    FP8_DTYPE,
    dequantize_activations,
    dequantize_fp8,
    quantize_activations,
    quantize_activations_ref,
)
from triton_kernels.host_math import cdiv


def fp8_gemm_ref(*, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [M, K]; weight: [N, K] e4m3; weight_scale_inv: [ceil(N/128), ceil(K/128)] float32; bias: [N] or
    None. Returns [M, N] in x's dtype: quantize x's groups, dequantize both to float32, one matmul."""
    y = F.linear(dequantize_activations(*quantize_activations_ref(x)), dequantize_fp8(weight, weight_scale_inv))
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


@triton.jit
def _fp8_gemm_kernel(a, a_s, w, w_s, b, y, M, N, K, stride_am, stride_asm, stride_ask, stride_wn, stride_wsn,
                     stride_ym, HAS_BIAS: tl.constexpr, EMULATE_FP8: tl.constexpr, GROUP_M: tl.constexpr,
                     M_BUCKET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] tile of y from quantized activations a [M, K] e4m3 with scales a_s
    [M, K/128]; BLOCK_K is the 128-column group. Tiles run GROUP_M row-tiles at a time per column
    band, so a band's weight stays in L2 while they read it. M_BUCKET only keys the autotuner."""
    pid = tl.program_id(0)
    n_m, n_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    first_m = (pid // (GROUP_M * n_n)) * GROUP_M
    rows = tl.minimum(n_m - first_m, GROUP_M)
    i_m = first_m + (pid % (GROUP_M * n_n)) % rows
    i_n = (pid % (GROUP_M * n_n)) // rows
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    m_m, m_n = o_m < M, o_n < N
    p_a = a + o_m.to(tl.int64)[:, None] * stride_am + o_k[None, :]
    p_w = w + o_n.to(tl.int64)[None, :] * stride_wn + o_k[:, None]  # [BLOCK_K, BLOCK_N] view of w^T
    p_as = a_s + o_m * stride_asm
    p_ws = w_s + (o_n // BLOCK_K) * stride_wsn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        m_k = (k0 + o_k) < K
        b_a = tl.load(p_a + k0, mask=m_m[:, None] & m_k[None, :], other=0.0)
        b_w = tl.load(p_w + k0, mask=m_k[:, None] & m_n[None, :], other=0.0)
        b_as = tl.load(p_as + (k0 // BLOCK_K) * stride_ask, mask=m_m, other=0.0)  # [BLOCK_M]
        b_ws = tl.load(p_ws + k0 // BLOCK_K, mask=m_n, other=0.0)  # [BLOCK_N]
        if EMULATE_FP8:  # the interpreter has no FP8 dot; e4m3 products are exact in float32
            part = tl.dot(b_a.to(tl.float32), b_w.to(tl.float32), input_precision="ieee")
        else:
            part = tl.dot(b_a, b_w)
        acc += part * b_as[:, None] * b_ws[None, :]
    if HAS_BIAS:
        acc += tl.load(b + o_n, mask=m_n, other=0.0).to(tl.float32)[None, :]
    p_y = y + o_m.to(tl.int64)[:, None] * stride_ym + o_n[None, :]
    tl.store(p_y, acc.to(y.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


_CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
            for bm, bn, w, st in [(64, 64, 4, 4), (64, 128, 4, 4), (128, 128, 8, 3), (128, 128, 4, 4),
                                  (128, 256, 8, 3), (128, 64, 4, 4)]]
_fp8_gemm_tuned = cached_launch(triton.autotune(
    configs=_CONFIGS, key=["N", "K", "M_BUCKET"],
    do_bench=functools.partial(triton.testing.do_bench, warmup=5, rep=20))(_fp8_gemm_kernel))


def _m_bucket(m: int) -> int:
    return 128 if m <= 128 else 512 if m <= 512 else 2048 if m <= 2048 else 8192


def _triton_gemm(q: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                 bias: torch.Tensor | None, y: torch.Tensor) -> None:
    m, k = q.shape
    n = weight.shape[0]
    args = (q, scale, weight, weight_scale_inv, bias if bias is not None else y, y, m, n, k, q.stride(0),
            scale.stride(0), scale.stride(1), weight.stride(0), weight_scale_inv.stride(0), y.stride(0))
    flags = dict(HAS_BIAS=bias is not None, GROUP_M=8, BLOCK_K=FP8_BLOCK)
    if q.is_cuda:
        grid = lambda meta: (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
        _fp8_gemm_tuned[grid](*args, EMULATE_FP8=False, M_BUCKET=_m_bucket(m), **flags)
    else:  # the interpreter: one config
        _fp8_gemm_kernel[(cdiv(m, 16) * cdiv(n, 32),)](*args, EMULATE_FP8=True, M_BUCKET=0,
                                                                     BLOCK_M=16, BLOCK_N=32, **flags)


@functools.cache
def _cublas_takes(n: int, k: int, device: torch.device) -> bool:
    """Whether torch's block-scaled `scaled_mm` runs this weight shape here (CUDA builds with cuBLAS
    block scaling, Hopper); asked once per shape with a 4-row product."""
    if device.type != "cuda" or not hasattr(F, "scaled_mm") or n % 16 or k % FP8_BLOCK:
        return False
    try:
        q, scale = quantize_activations(torch.zeros(4, k, device=device))
        _cublas_gemm(q, scale, torch.zeros(n, k, dtype=FP8_DTYPE, device=device),
                     torch.ones(cdiv(n, FP8_BLOCK), k // FP8_BLOCK, device=device), torch.bfloat16)
    except (RuntimeError, NotImplementedError, ValueError):  # (torch 2.11 refuses some small N with ValueError)
        return False
    return True


def _cublas_gemm(q: torch.Tensor, scale: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                 dtype: torch.dtype) -> torch.Tensor:
    """q [M, K] e4m3 (M a multiple of 4), scale [M, K/128] column-major -> [M, N] in dtype."""
    return F.scaled_mm(q, weight.t(), scale, F.ScalingType.BlockWise1x128, weight_scale_inv.t(),
                       F.ScalingType.BlockWise128x128, output_dtype=dtype)


def fp8_gemm(*, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
             bias: torch.Tensor | None = None, cublas: bool | None = None) -> torch.Tensor:
    """Same contract as fp8_gemm_ref: x [M, K], weight [N, K] e4m3, weight_scale_inv
    [ceil(N/128), ceil(K/128)] float32, bias [N] or None -> [M, N] in x's dtype. cublas: None picks
    cuBLAS where it runs the shape, False forces the Triton kernel (tuned once per (N, K, M bucket)
    on first use, before any graph capture)."""
    m, k = x.shape
    n = weight.shape[0]
    assert weight.shape == (n, k) and weight.dtype == FP8_DTYPE, f"weight {tuple(weight.shape)} {weight.dtype}"
    assert weight_scale_inv.shape == (cdiv(n, FP8_BLOCK), cdiv(k, FP8_BLOCK)), \
        f"weight_scale_inv {tuple(weight_scale_inv.shape)} for weight {(n, k)}"
    assert weight_scale_inv.dtype == torch.float32 and (bias is None or bias.shape == (n,))
    weight, weight_scale_inv = weight.contiguous(), weight_scale_inv.contiguous()
    if cublas is None:
        cublas = x.dtype != torch.float32 and _cublas_takes(n, k, x.device)
    if m and cublas:
        q, scale = quantize_activations(x, rows=-(-m // 4) * 4)
        y = _cublas_gemm(q, scale, weight, weight_scale_inv, x.dtype)[:m]
        return y + bias if bias is not None else y
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m:
        _triton_gemm(*quantize_activations(x), weight, weight_scale_inv, bias, y)
    return y
