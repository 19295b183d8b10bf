"""Fused pieces around attention (Qwen3-Next / Qwen3.5's gated attention, and rotary alone for the others).

qk_norm_rope:      per-head RMSNorm of q and k (weights + offset), then neox rotary on the first
                   `rotary_dim` dims at each token's position; reads q / k as strided views of the
                   fused projection and writes contiguous [T, H, D] outputs.
rope:              the same without the norm (Falcon-H1, Bamba): one launch for q and k.
sigmoid_gate_mul:  o * sigmoid(gate), with gate a strided view (the second half of each q head).
"""

import torch
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.host_math import next_power_of_2
from triton_kernels.norms import rmsnorm_ref


def rope_ref(*, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor,
             rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, Hq, D], k: [T, Hkv, D] (any strides); cos_sin: [max_pos, rotary_dim] (cos | sin); positions: [T].
    Neox (rotate-half) rotary on the first rotary_dim dims of each head, in float32 and rounded to the
    input's dtype; the other dims as they are. Returns contiguous (q, k)."""
    cos, sin = cos_sin[positions].float().unsqueeze(1).chunk(2, dim=-1)  # [T, 1, rot/2]

    def one(x):
        x1, x2 = x[..., :rotary_dim].float().chunk(2, dim=-1)
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
        return rotated if rotary_dim == x.shape[-1] else torch.cat([rotated, x[..., rotary_dim:]], dim=-1)

    return one(q), one(k)


def qk_norm_rope_ref(*, q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                     cos_sin: torch.Tensor, positions: torch.Tensor, eps: float, offset: float,
                     rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, Hq, D], k: [T, Hkv, D] (any strides); cos_sin: [max_pos, rotary_dim] (cos | sin);
    positions: [T]. Returns normalized, rotated (q, k), contiguous, in q's dtype."""
    def norm(x, w):
        return rmsnorm_ref(x=x.reshape(-1, x.shape[-1]), weight=w, eps=eps, offset=offset).view(x.shape)

    return rope_ref(q=norm(q, q_weight), k=norm(k, k_weight), cos_sin=cos_sin, positions=positions,
                    rotary_dim=rotary_dim)


def sigmoid_gate_mul_ref(*, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """o: [T, H, D]; gate: [T, H, D] (any strides). Returns o * sigmoid(gate) as [T, H * D]."""
    return (o * torch.sigmoid(gate)).reshape(o.shape[0], -1)


@cached_launch
@triton.jit
def _qk_norm_rope_kernel(q, k, q_out, k_out, wq, wk, cos_sin, positions,
                         stride_qt, stride_qh, stride_kt, stride_kh, stride_cs, eps, offset,
                         HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                         BLOCK_D: tl.constexpr, NORM: tl.constexpr):
    """One program per (token, q or k head). NORM False: rotary alone (wq, wk, eps, offset unread)."""
    i_t = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    if i_h < HQ:
        p_x = q + i_t * stride_qt + i_h * stride_qh
        p_y = q_out + (i_t * HQ + i_h) * D
        p_w = wq
    else:
        p_x = k + i_t * stride_kt + (i_h - HQ) * stride_kh
        p_y = k_out + (i_t * HKV + i_h - HQ) * D
        p_w = wk
    o_d = tl.arange(0, BLOCK_D)
    m_d = o_d < D
    in_rot = o_d < 2 * HALF
    o_p = tl.where(o_d < HALF, o_d + HALF, o_d - HALF)  # rotate-half partner
    b_n = tl.load(p_x + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_p = tl.load(p_x + o_p, mask=in_rot, other=0.0).to(tl.float32)
    if NORM:
        b_rstd = tl.rsqrt(tl.sum(b_n * b_n, 0) / D + eps)
        b_n = b_n * b_rstd * (tl.load(p_w + o_d, mask=m_d, other=0.0).to(tl.float32) + offset)
        b_n = b_n.to(q_out.dtype.element_ty).to(tl.float32)  # eager rounds after the norm
        b_p = b_p * b_rstd * (tl.load(p_w + o_p, mask=in_rot, other=0.0).to(tl.float32) + offset)
        b_p = b_p.to(q_out.dtype.element_ty).to(tl.float32)
    pos = tl.load(positions + i_t).to(tl.int64)
    o_f = o_d % HALF
    b_cos = tl.load(cos_sin + pos * stride_cs + o_f, mask=in_rot, other=1.0).to(tl.float32)
    b_sin = tl.load(cos_sin + pos * stride_cs + HALF + o_f, mask=in_rot, other=0.0).to(tl.float32)
    b_sign = tl.where(o_d < HALF, -1.0, 1.0)
    b_y = tl.where(in_rot, b_n * b_cos + b_sign * b_p * b_sin, b_n)
    tl.store(p_y + o_d, b_y.to(q_out.dtype.element_ty), mask=m_d)


def qk_norm_rope(*, q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor, k_weight: torch.Tensor,
                 cos_sin: torch.Tensor, positions: torch.Tensor, eps: float, offset: float,
                 rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _prep(q, k, (q_weight, k_weight), cos_sin, positions, eps, offset, rotary_dim)


def rope(*, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor,
         rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _prep(q, k, None, cos_sin, positions, 0.0, 0.0, rotary_dim)


def _prep(q: torch.Tensor, k: torch.Tensor, weights: tuple[torch.Tensor, torch.Tensor] | None, cos_sin: torch.Tensor,
          positions: torch.Tensor, eps: float, offset: float, rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """qk_norm_rope (weights given) or rope (None) in one launch: contiguous q [T, Hq, D], k [T, Hkv, D]."""
    t, hq, d = q.shape
    hkv = k.shape[1]
    assert k.shape == (t, hkv, d) and q.stride(2) == 1 and k.stride(2) == 1, "head dims must be unit-stride"
    assert cos_sin.shape[1] == rotary_dim and rotary_dim % 2 == 0 and cos_sin.is_contiguous()
    q_out = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    k_out = torch.empty((t, hkv, d), dtype=k.dtype, device=k.device)
    if t == 0:
        return q_out, k_out
    wq, wk = weights if weights is not None else (q, k)  # (unread without the norm)
    _qk_norm_rope_kernel[(t, hq + hkv)](
        q, k, q_out, k_out, wq, wk, cos_sin, positions, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), cos_sin.stride(0), eps, offset, HQ=hq, HKV=hkv, D=d, HALF=rotary_dim // 2,
        BLOCK_D=next_power_of_2(d), NORM=weights is not None)
    return q_out, k_out


@cached_launch
@triton.jit
def _sigmoid_gate_mul_kernel(o, g, y, stride_ot, stride_oh, stride_gt, stride_gh,
                             H: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr):
    i_t = tl.program_id(0).to(tl.int64)
    i_h = tl.program_id(1)
    o_d = tl.arange(0, BLOCK_D)
    m = o_d < D
    b_o = tl.load(o + i_t * stride_ot + i_h * stride_oh + o_d, mask=m, other=0.0)
    b_g = tl.load(g + i_t * stride_gt + i_h * stride_gh + o_d, mask=m, other=0.0)
    b_s = tl.sigmoid(b_g.to(tl.float32)).to(b_o.dtype)  # sigmoid in the model dtype, as eager
    tl.store(y + (i_t * H + i_h) * D + o_d, b_o * b_s, mask=m)


def sigmoid_gate_mul(*, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    t, h, d = o.shape
    assert gate.shape == o.shape and o.stride(2) == 1 and gate.stride(2) == 1
    y = torch.empty((t, h * d), dtype=o.dtype, device=o.device)
    if t:
        _sigmoid_gate_mul_kernel[(t, h)](o, gate, y, o.stride(0), o.stride(1), gate.stride(0), gate.stride(1),
                                         H=h, D=d, BLOCK_D=next_power_of_2(d))
    return y
