"""Block-scaled FP8 GEMM: y = x @ dequant(w)^T, the layout of DeepSeek's and Qwen's FP8 releases.

w [N, K] float8_e4m3fn holds one 128 x 128 block per scale; weight_scale_inv [ceil(N/128), ceil(K/128)]
float32 multiplies it back: dequant(w)[n, k] = w[n, k] * weight_scale_inv[n // 128, k // 128].

Activations are not quantized: the kernel widens each e4m3 tile to x's dtype (exact for bfloat16,
float16 and float32), multiplies in tensor cores with a float32 accumulator per K tile, and scales
that partial sum by the tile's block scales. Weights move at one byte each, the decode-time win;
the error is the weights' quantization alone, none from activations.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

FP8_BLOCK = 128
FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite e4m3fn value


def fp8_gemm_ref(*, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [M, K]; weight: [N, K] e4m3; weight_scale_inv: [ceil(N/128), ceil(K/128)] float32; bias: [N] or
    None. Returns [M, N] in x's dtype: dequantize to float32, then one matmul."""
    w = dequantize_fp8(weight, weight_scale_inv)
    y = F.linear(x.float(), w)
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
def _fp8_gemm_kernel(x, w, s, b, y, M, N, K, stride_xm, stride_wn, stride_sn, stride_ym,
                     HAS_BIAS: tl.constexpr, GROUP: tl.constexpr, PREC: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] tile of y; BLOCK_K divides GROUP, so each K tile has one scale per row."""
    i_m, i_n = tl.program_id(0), tl.program_id(1)
    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    m_m, m_n = o_m < M, o_n < N
    p_x = x + o_m[:, None] * stride_xm + o_k[None, :]
    p_w = w + o_n[None, :] * stride_wn + o_k[:, None]  # [BLOCK_K, BLOCK_N] view of w^T
    p_s = s + (o_n // GROUP) * stride_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        m_k = (k0 + o_k) < K
        b_x = tl.load(p_x + k0, mask=m_m[:, None] & m_k[None, :], other=0.0)
        b_w = tl.load(p_w + k0, mask=m_k[:, None] & m_n[None, :], other=0.0).to(b_x.dtype)
        b_s = tl.load(p_s + k0 // GROUP, mask=m_n, other=0.0)  # [BLOCK_N]
        acc += tl.dot(b_x, b_w, input_precision=PREC) * b_s[None, :]
    if HAS_BIAS:
        acc += tl.load(b + o_n, mask=m_n, other=0.0).to(tl.float32)[None, :]
    p_y = y + o_m[:, None] * stride_ym + o_n[None, :]
    tl.store(p_y, acc.to(y.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


def fp8_gemm(*, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
             bias: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as fp8_gemm_ref: x [M, K], weight [N, K] e4m3, weight_scale_inv
    [ceil(N/128), ceil(K/128)] float32, bias [N] or None -> [M, N] in x's dtype."""
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
    interpret = not x.is_cuda
    block_m = 16 if interpret or m <= 16 else 64
    block_n, block_k = (32, 32) if interpret else (64, FP8_BLOCK)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _fp8_gemm_kernel[grid](x, weight, weight_scale_inv, bias if bias is not None else y, y, m, n, k,
                           x.stride(0), weight.stride(0), weight_scale_inv.stride(0), y.stride(0),
                           HAS_BIAS=bias is not None, GROUP=FP8_BLOCK,
                           PREC="ieee" if x.dtype == torch.float32 else "tf32",
                           BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k)
    return y
