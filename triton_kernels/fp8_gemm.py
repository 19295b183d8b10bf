"""Block-scaled FP8 GEMM: y = q(x) @ dequant(w)^T, the layout and activation scheme of DeepSeek's and
Qwen's FP8 releases ("dynamic" activation scales over 1 x 128 groups).

w [N, K] float8_e4m3fn holds one 128 x 128 block per scale; weight_scale_inv [ceil(N/128), ceil(K/128)]
float32 multiplies it back: dequant(w)[n, k] = w[n, k] * weight_scale_inv[n // 128, k // 128].
x [M, K] (bf16, fp16 or fp32) is quantized per token and 128-column group, inside the GEMM: each group
gets scale amax / 448 (1 for an all-zero group) and its values round to e4m3, so q(x)[m, k] =
e4m3(x[m, k] / s[m, k // 128]) * s[m, k // 128]. Each K tile is one group: the kernel multiplies e4m3
by e4m3 on the FP8 tensor cores (twice bf16's rate) into float32, then scales the tile's partial sum
by its activation and weight scales. Weights move at one byte each (decode), products run at FP8 rate
(prefill); every row is quantized on its own, so a token's result does not depend on its batch.
"""

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
import triton.testing

FP8_BLOCK = 128
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
INV_FP8_MAX = 1.0 / FP8_MAX  # rounds to float32 where it multiplies a float32 tensor, as in the kernel


def quantize_activations_ref(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] -> q(x) [M, K] float32: each token's 128-column groups scaled to amax 448, rounded to
    e4m3 and scaled back (the kernel's activation quantization)."""
    m, k = x.shape
    kb = triton.cdiv(k, FP8_BLOCK)
    padded = x.new_zeros(m, kb * FP8_BLOCK, dtype=torch.float32)
    padded[:, :k] = x.float()
    groups = padded.view(m, kb, FP8_BLOCK)
    amax = groups.abs().amax(dim=2, keepdim=True)
    nonzero = amax > 0
    inv = torch.where(nonzero, FP8_MAX / amax, 1.0)  # the kernel's float32 operations, in its order
    scale = torch.where(nonzero, amax * INV_FP8_MAX, 1.0)
    q = (groups * inv).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).float() * scale
    return q.view(m, kb * FP8_BLOCK)[:, :k]


def fp8_gemm_ref(*, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [M, K]; weight: [N, K] e4m3; weight_scale_inv: [ceil(N/128), ceil(K/128)] float32; bias: [N] or
    None. Returns [M, N] in x's dtype: quantize x's groups, dequantize both to float32, one matmul."""
    w = dequantize_fp8(weight, weight_scale_inv)
    y = F.linear(quantize_activations_ref(x), w)
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def dequantize_fp8(weight: torch.Tensor, weight_scale_inv: torch.Tensor) -> torch.Tensor:
    """weight [N, K] e4m3, weight_scale_inv [ceil(N/128), ceil(K/128)] -> [N, K] float32."""
    n, k = weight.shape
    scale = weight_scale_inv.repeat_interleave(FP8_BLOCK, 0)[:n].repeat_interleave(FP8_BLOCK, 1)[:, :k]
    return weight.float() * scale


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] (any float dtype) -> (e4m3 [N, K], weight_scale_inv [ceil(N/128), ceil(K/128)] float32),
    each 128 x 128 block scaled so that its largest magnitude maps to 448 (an all-zero block gets scale 1)."""
    n, k = weight.shape
    nb, kb = triton.cdiv(n, FP8_BLOCK), triton.cdiv(k, FP8_BLOCK)
    padded = weight.new_zeros(nb * FP8_BLOCK, kb * FP8_BLOCK, dtype=torch.float32)
    padded[:n, :k] = weight.float()
    blocks = padded.view(nb, FP8_BLOCK, kb, FP8_BLOCK)  # [nb, 128, kb, 128]
    amax = blocks.abs().amax(dim=(1, 3))  # [nb, kb]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(nb * FP8_BLOCK, kb * FP8_BLOCK)[:n, :k].contiguous(), scale


@triton.jit
def _round_to_e4m3(v):
    """float32 |v| <= 448 -> the nearest e4m3 value, in float32 arithmetic. The interpreter's own
    float32 -> e4m3 cast halves values that round up to a power of two."""
    mag = tl.abs(v)
    e = tl.maximum(tl.floor(tl.log2(tl.maximum(mag, 1e-30))), -6.0)  # subnormals share 2**-6's step
    step = tl.exp2(e - 3.0)  # 3 mantissa bits
    return tl.where(v < 0, -1.0, 1.0) * tl.floor(mag / step + 0.5) * step


@triton.jit
def _fp8_gemm_kernel(x, w, s, b, y, M, N, K, stride_xm, stride_wn, stride_sn, stride_ym,
                     INV_MAX: tl.constexpr, HAS_BIAS: tl.constexpr, EMULATE_FP8: tl.constexpr, M_BUCKET: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] tile of y; BLOCK_K is the 128-column group, so each K tile has one
    activation scale per row and one weight scale per column. M_BUCKET only keys the autotuner."""
    i_m, i_n = tl.program_id(0), tl.program_id(1)
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
        b_x = tl.load(p_x + k0, mask=m_m[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        b_w = tl.load(p_w + k0, mask=m_k[:, None] & m_n[None, :], other=0.0)
        b_ws = tl.load(p_s + k0 // BLOCK_K, mask=m_n, other=0.0)  # [BLOCK_N]
        amax = tl.max(tl.abs(b_x), 1)  # [BLOCK_M]
        if EMULATE_FP8:  # the interpreter's division is IEEE already
            b_inv = tl.where(amax > 0, 448.0 / tl.maximum(amax, 1e-30), 1.0)
        else:
            b_inv = tl.where(amax > 0, tl.math.div_rn(tl.full([BLOCK_M], 448.0, tl.float32), amax), 1.0)
        b_xs = tl.where(amax > 0, amax * INV_MAX, 1.0)
        b_q = tl.minimum(tl.maximum(b_x * b_inv[:, None], -448.0), 448.0)
        if EMULATE_FP8:
            part = tl.dot(_round_to_e4m3(b_q), b_w.to(tl.float32), input_precision="ieee")
        else:
            part = tl.dot(b_q.to(tl.float8e4nv), b_w)
        acc += part * b_xs[:, None] * b_ws[None, :]
    if HAS_BIAS:
        acc += tl.load(b + o_n, mask=m_n, other=0.0).to(tl.float32)[None, :]
    p_y = y + o_m.to(tl.int64)[:, None] * stride_ym + o_n[None, :]
    tl.store(p_y, acc.to(y.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


def _configs() -> list[triton.Config]:
    """Small M (decode): 16-row tiles, column tiles from 16 to 128 wide (how many programs stream the
    weight), deep pipelines. Larger M (prefill): square-ish 64-256 tiles on one or two warpgroups."""
    small = [triton.Config({"BLOCK_M": 16, "BLOCK_N": bn}, num_warps=w, num_stages=st)
             for bn, w, st in [(16, 4, 8), (32, 4, 6), (64, 4, 5), (128, 4, 4), (64, 8, 6)]]
    large = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
             for bm, bn, w, st in [(64, 64, 4, 4), (64, 128, 4, 4), (128, 128, 8, 3), (128, 256, 8, 3),
                                   (128, 64, 4, 4)]]
    return small + large


def _prune(configs, named_args, **kwargs):
    small = named_args.get("M_BUCKET", kwargs.get("M_BUCKET")) <= 16
    return [c for c in configs if (c.kwargs["BLOCK_M"] == 16) == small]


_fp8_gemm_tuned = triton.autotune(
    configs=_configs(), key=["N", "K", "M_BUCKET"], prune_configs_by={"early_config_prune": _prune},
    do_bench=functools.partial(triton.testing.do_bench, warmup=5, rep=20))(_fp8_gemm_kernel)


def _m_bucket(m: int) -> int:
    return 16 if m <= 16 else 64 if m <= 64 else 256 if m <= 256 else 1024


def fp8_gemm(*, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
             bias: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as fp8_gemm_ref: x [M, K], weight [N, K] e4m3, weight_scale_inv
    [ceil(N/128), ceil(K/128)] float32, bias [N] or None -> [M, N] in x's dtype. On CUDA the launch
    config is tuned once per (N, K, M bucket) on first use (warm-up, before any graph capture)."""
    m, k = x.shape
    n = weight.shape[0]
    assert weight.shape == (n, k) and weight.dtype == FP8_DTYPE, f"weight {tuple(weight.shape)} {weight.dtype}"
    assert weight_scale_inv.shape == (triton.cdiv(n, FP8_BLOCK), triton.cdiv(k, FP8_BLOCK)), \
        f"weight_scale_inv {tuple(weight_scale_inv.shape)} for weight {(n, k)}"
    assert weight_scale_inv.dtype == torch.float32 and (bias is None or bias.shape == (n,))
    x, weight, weight_scale_inv = x.contiguous(), weight.contiguous(), weight_scale_inv.contiguous()
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    args = (x, weight, weight_scale_inv, bias if bias is not None else y, y, m, n, k,
            x.stride(0), weight.stride(0), weight_scale_inv.stride(0), y.stride(0))
    flags = dict(INV_MAX=INV_FP8_MAX, HAS_BIAS=bias is not None, M_BUCKET=_m_bucket(m), BLOCK_K=FP8_BLOCK)
    if x.is_cuda:
        grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))  # noqa: E731
        _fp8_gemm_tuned[grid](*args, EMULATE_FP8=False, **flags)
    else:  # the interpreter: one config, e4m3 rounding done in float32
        _fp8_gemm_kernel[(triton.cdiv(m, 16), triton.cdiv(n, 32))](*args, EMULATE_FP8=True, BLOCK_M=16,
                                                                   BLOCK_N=32, **flags)
    return y
