"""FP8 (e4m3) quantization in the layout of DeepSeek's and Qwen's FP8 releases.

Weights: w [N, K] float8_e4m3fn with one float32 scale per 128 x 128 block, weight_scale_inv
[ceil(N/128), ceil(K/128)]: dequant(w)[n, k] = w[n, k] * weight_scale_inv[n // 128, k // 128].
Activations ("dynamic" scheme): each token's 128-column group gets scale amax / 448 (1 for an all-zero
group) and its values round to e4m3: q(x)[m, k] = e4m3(x[m, k] / s[m, k // 128]) * s[m, k // 128].
`quantize_activations` is the Triton kernel that does it once per GEMM, ahead of the FP8 GEMM.
"""

import torch
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.host_math import cdiv, next_power_of_2

FP8_BLOCK = 128
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value
INV_FP8_MAX = 1.0 / FP8_MAX  # rounds to float32 where it multiplies a float32 tensor, as in the kernel


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [N, K] (any float dtype) -> (e4m3 [N, K], weight_scale_inv [ceil(N/128), ceil(K/128)] float32),
    each 128 x 128 block scaled so that its largest magnitude maps to 448 (an all-zero block gets scale 1)."""
    n, k = weight.shape
    nb, kb = cdiv(n, FP8_BLOCK), cdiv(k, FP8_BLOCK)
    padded = weight.new_zeros(nb * FP8_BLOCK, kb * FP8_BLOCK, dtype=torch.float32)
    padded[:n, :k] = weight.float()
    blocks = padded.view(nb, FP8_BLOCK, kb, FP8_BLOCK)  # [nb, 128, kb, 128]
    amax = blocks.abs().amax(dim=(1, 3))  # [nb, kb]
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(nb * FP8_BLOCK, kb * FP8_BLOCK)[:n, :k].contiguous(), scale


def quantize_fp8_stacked(weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked expert weights [E, N, K] -> (e4m3 [E, N, K], scales [E, ceil(N/128), ceil(K/128)] float32),
    each expert's matrix quantized by quantize_fp8."""
    pairs = [quantize_fp8(w) for w in weights]
    return torch.stack([q for q, _ in pairs]), torch.stack([s for _, s in pairs])


def dequantize_fp8(weight: torch.Tensor, weight_scale_inv: torch.Tensor) -> torch.Tensor:
    """weight [N, K] e4m3, weight_scale_inv [ceil(N/128), ceil(K/128)] -> [N, K] float32."""
    n, k = weight.shape
    scale = weight_scale_inv.repeat_interleave(FP8_BLOCK, 0)[:n].repeat_interleave(FP8_BLOCK, 1)[:, :k]
    return weight.float() * scale


def quantize_activations_ref(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K] e4m3, scale [M, ceil(K/128)] float32): each token's 128-column groups
    scaled to amax 448 and rounded to e4m3 (the kernel's float32 operations, in its order)."""
    m, k = x.shape
    kb = cdiv(k, FP8_BLOCK)
    padded = x.new_zeros(m, kb * FP8_BLOCK, dtype=torch.float32)
    padded[:, :k] = x.float()
    groups = padded.view(m, kb, FP8_BLOCK)
    amax = groups.abs().amax(dim=2, keepdim=True)
    nonzero = amax > 0
    inv = torch.where(nonzero, FP8_MAX / amax, 1.0)
    scale = torch.where(nonzero, amax * INV_FP8_MAX, 1.0)
    q = (groups * inv).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q.view(m, kb * FP8_BLOCK)[:, :k], scale[:, :, 0]


def dequantize_activations(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """q [M, K] e4m3, scale [M, ceil(K/128)] -> q(x) [M, K] float32."""
    return q.float() * scale.repeat_interleave(FP8_BLOCK, 1)[:, :q.shape[1]]


@triton.jit
def _round_to_e4m3(v):
    """float32 |v| <= 448 -> the nearest e4m3 value, in float32 arithmetic. The interpreter's own
    float32 -> e4m3 cast halves values that round up to a power of two."""
    mag = tl.abs(v)
    e = tl.maximum(tl.floor(tl.log2(tl.maximum(mag, 1e-30))), -6.0)  # subnormals share 2**-6's step
    step = tl.exp2(e - 3.0)  # 3 mantissa bits
    return tl.where(v < 0, -1.0, 1.0) * tl.floor(mag / step + 0.5) * step


@cached_launch
@triton.jit
def _quantize_activations_kernel(x, q, s, M, K, stride_xm, stride_qm, stride_sm, stride_sk,
                                 INV_MAX: tl.constexpr, EMULATE_FP8: tl.constexpr, GROUPS: tl.constexpr,
                                 BLOCK_K: tl.constexpr):
    """One row's GROUPS consecutive 128-column groups. Rows from M on (padding) get zeros, scale 1."""
    i_m, i_g = tl.program_id(0), tl.program_id(1)
    o_g = i_g * GROUPS + tl.arange(0, GROUPS)
    o_k = o_g[:, None] * BLOCK_K + tl.arange(0, BLOCK_K)[None, :]  # [GROUPS, BLOCK_K]
    in_row = o_k < K
    k_read = tl.where(i_m < M, K, 0)  # padding rows read nothing
    b_x = tl.load(x + i_m.to(tl.int64) * stride_xm + o_k, mask=o_k < k_read, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(b_x), 1)  # [GROUPS]
    if EMULATE_FP8:  # the interpreter's division is IEEE already
        inv = tl.where(amax > 0, 448.0 / tl.maximum(amax, 1e-30), 1.0)
    else:
        inv = tl.where(amax > 0, tl.math.div_rn(tl.full([GROUPS], 448.0, tl.float32), amax), 1.0)
    b_q = tl.minimum(tl.maximum(b_x * inv[:, None], -448.0), 448.0)
    if EMULATE_FP8:
        b_q = _round_to_e4m3(b_q)
    tl.store(q + i_m.to(tl.int64) * stride_qm + o_k, b_q.to(q.dtype.element_ty), mask=in_row)
    scale = tl.where(amax > 0, amax * INV_MAX, 1.0)
    tl.store(s + i_m * stride_sm + o_g * stride_sk, scale, mask=o_g * BLOCK_K < K)


def quantize_activations(x: torch.Tensor, rows: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [rows, K] e4m3, scale [rows, ceil(K/128)] float32 stored column-major, as the
    block-scaled GEMMs read it); rows >= M pads with zero rows of scale 1 (default M)."""
    m, k = x.shape
    rows = m if rows is None else rows
    kb = cdiv(k, FP8_BLOCK)
    x = x.contiguous()
    q = torch.empty(rows, k, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(kb, rows, dtype=torch.float32, device=x.device).t()
    if rows == 0:
        return q, scale
    groups = min(8, next_power_of_2(kb))
    _quantize_activations_kernel[(rows, cdiv(kb, groups))](
        x, q, scale, m, k, x.stride(0), q.stride(0), scale.stride(0), scale.stride(1), INV_MAX=INV_FP8_MAX,
        EMULATE_FP8=not x.is_cuda, GROUPS=groups, BLOCK_K=FP8_BLOCK)
    return q, scale


# Decode kernels multiply e4m3 weights by 16-bit activations. Widening e4m3 to fp16 takes one conversion
# instruction per pair (to bf16 it takes several), so bf16 activations may go to fp16 instead: each row of
# a tile is first scaled by a power of two that brings its largest magnitude to [2**14, 2**15], where
# bf16's 8 significant bits fit fp16's 11 exactly, and the product is scaled back.


@triton.jit
def f16_rows(b_x, AXIS: tl.constexpr):
    """b_x: a tile of bf16 values whose rows (tokens) run along the other axis than AXIS -> (fp16 tile,
    shift [rows]): each row times 2**shift, in fp16 exactly."""
    amax = tl.max(tl.abs(b_x.to(tl.float32)), AXIS)
    shift = 14.0 - tl.floor(tl.log2(tl.maximum(amax, 1e-30)))
    return (b_x.to(tl.float32) * tl.exp2(tl.expand_dims(shift, AXIS))).to(tl.float16), shift

