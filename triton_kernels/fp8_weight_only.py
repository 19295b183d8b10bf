"""FP8-weight GEMM for few rows (decode): y = x @ dequant(w)^T with x unquantized. Formats in fp8_quant.py.

At decode a linear layer's time is the time to read its weight, so the e4m3 weight is read at one
byte per value and widened in registers to x's dtype (e4m3 values are exact in bf16, fp16 and fp32);
x is not quantized. Each 128-wide K tile is one weight-scale block: its partial sum over the tile is
multiplied by the column's block scale, so the products are those of x with the dequantized weight
and the result matches `dequantize, then matmul` to float32 rounding. Programs split the output
columns finely (16 to 128 per program) so that enough of them stream the weight at once.
"""

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import triton.testing

from triton_kernels.fp8_quant import FP8_BLOCK, FP8_DTYPE, dequantize_fp8

WEIGHT_ONLY_MAX_ROWS = 64  # the GEMMs of more rows quantize activations too (fp8_gemm.py)


def fp8_weight_only_gemm_ref(*, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                             bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [M, K]; weight: [N, K] e4m3; weight_scale_inv: [ceil(N/128), ceil(K/128)] float32; bias: [N] or
    None. Returns [M, N] in x's dtype: dequantize the weight to float32, one float32 matmul."""
    y = F.linear(x.float(), dequantize_fp8(weight, weight_scale_inv))
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


@triton.jit
def _weight_only_kernel(x, w, s, b, y, M, N, K, stride_xm, stride_wn, stride_sn, stride_ym,
                        HAS_BIAS: tl.constexpr, EXACT_DOT: tl.constexpr, M_BUCKET: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] tile of y; BLOCK_K is the 128-column scale block. M_BUCKET only keys
    the autotuner. EXACT_DOT: float32 x, multiplied in full float32 (no tf32)."""
    i_n, i_m = tl.program_id(0), tl.program_id(1)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    m_m, m_n = o_m < M, o_n < N
    p_x = x + o_m.to(tl.int64)[:, None] * stride_xm + o_k[None, :]
    p_w = w + o_n.to(tl.int64)[None, :] * stride_wn + o_k[:, None]  # [BLOCK_K, BLOCK_N] view of w^T
    p_s = s + (o_n // BLOCK_K) * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        m_k = (k0 + o_k) < K
        b_x = tl.load(p_x + k0, mask=m_m[:, None] & m_k[None, :], other=0.0)
        b_w = tl.load(p_w + k0, mask=m_k[:, None] & m_n[None, :], other=0.0).to(b_x.dtype)
        b_s = tl.load(p_s + k0 // BLOCK_K, mask=m_n, other=0.0)  # [BLOCK_N]
        if EXACT_DOT:
            part = tl.dot(b_x, b_w, input_precision="ieee")
        else:
            part = tl.dot(b_x, b_w)
        acc += part * b_s[None, :]
    if HAS_BIAS:
        acc += tl.load(b + o_n, mask=m_n, other=0.0).to(tl.float32)[None, :]
    p_y = y + o_m.to(tl.int64)[:, None] * stride_ym + o_n[None, :]
    tl.store(p_y, acc.to(y.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


_CONFIGS = [triton.Config({"BLOCK_N": bn}, num_warps=w, num_stages=st)
            for bn, w, st in [(16, 4, 4), (16, 4, 8), (32, 4, 4), (32, 4, 6), (64, 4, 4), (64, 4, 6),
                              (128, 4, 4), (128, 8, 4), (16, 2, 6), (32, 2, 6)]]
_weight_only_tuned = triton.autotune(
    configs=_CONFIGS, key=["N", "K", "M_BUCKET"],
    do_bench=functools.partial(triton.testing.do_bench, warmup=5, rep=20))(_weight_only_kernel)


def fp8_weight_only_gemm(*, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as fp8_weight_only_gemm_ref, for M <= WEIGHT_ONLY_MAX_ROWS: x [M, K], weight [N, K]
    e4m3, weight_scale_inv [ceil(N/128), ceil(K/128)] float32, bias [N] or None -> [M, N] in x's dtype.
    On CUDA the launch config is tuned once per (N, K, M bucket) on first use, before graph capture."""
    m, k = x.shape
    n = weight.shape[0]
    assert m <= WEIGHT_ONLY_MAX_ROWS, f"{m} rows: use fp8_gemm above {WEIGHT_ONLY_MAX_ROWS}"
    assert weight.shape == (n, k) and weight.dtype == FP8_DTYPE, f"weight {tuple(weight.shape)} {weight.dtype}"
    assert weight_scale_inv.shape == (triton.cdiv(n, FP8_BLOCK), triton.cdiv(k, FP8_BLOCK)), \
        f"weight_scale_inv {tuple(weight_scale_inv.shape)} for weight {(n, k)}"
    assert weight_scale_inv.dtype == torch.float32 and (bias is None or bias.shape == (n,))
    x, weight, weight_scale_inv = x.contiguous(), weight.contiguous(), weight_scale_inv.contiguous()
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    bucket = max(16, triton.next_power_of_2(m))  # 16, 32 or 64: one row tile reads the weight once
    args = (x, weight, weight_scale_inv, bias if bias is not None else y, y, m, n, k,
            x.stride(0), weight.stride(0), weight_scale_inv.stride(0), y.stride(0))
    flags = dict(HAS_BIAS=bias is not None, EXACT_DOT=x.dtype == torch.float32, M_BUCKET=bucket,
                 BLOCK_M=bucket, BLOCK_K=FP8_BLOCK)
    if x.is_cuda:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), 1)  # noqa: E731
        _weight_only_tuned[grid](*args, **flags)
    else:  # the interpreter: one config
        _weight_only_kernel[(triton.cdiv(n, 32), 1)](*args, BLOCK_N=32, **flags)
    return y
