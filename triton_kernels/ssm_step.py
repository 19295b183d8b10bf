"""SSM decode step: one token per request, recurrent state updated in place in the pool.

Mamba2 (`mamba2_decode`): per head h, scalar decay over a [P, N] state
    dt  = clamp(softplus(dt + dt_bias), dt_min, dt_max)          [B, H]
    s   = exp(dt * A) * s + dt * x (outer) B_g                     A = -exp(A_log), g = group of h
    y   = s @ C_g + D * x,  then y *= silu(z) when z is given
Mamba-1 (`mamba1_decode`, Jamba): per channel d, a [N] state with its own decay row A[d, :].
Rows whose slot is `pad_slot` are skipped (their output is zero and no state is touched).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.host_math import cdiv, next_power_of_2


@triton.jit
def softplus(b_x):
    """torch's softplus in float32: log1p(exp(x)), and x itself above 20. log1p(u) is taken as
    log(w) * u / (w - 1) with w = 1 + u, which keeps the relative precision of a small u."""
    b_u = tl.exp(tl.minimum(b_x, 20.0))
    b_w = 1.0 + b_u
    b_log1p = tl.where(b_w == 1.0, b_u, tl.log(b_w) * (b_u / (b_w - 1.0)))
    return tl.where(b_x <= 20.0, b_log1p, b_x)


@cached_launch
@triton.jit
def _mamba2_decode_kernel(
    x,
    dt,
    A_log,
    B,
    C,
    D,
    dt_bias,
    z,
    ssm_states,
    state_slots,
    y,
    stride_x_b,
    stride_x_h,
    stride_dt_b,
    stride_B_b,
    stride_B_g,
    stride_C_b,
    stride_C_g,
    stride_z_b,
    stride_z_h,
    stride_s,
    pad_slot,
    dt_min,
    dt_max,
    H: tl.constexpr,
    G: tl.constexpr,
    P: tl.constexpr,
    N: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
    HAS_Z: tl.constexpr,
):
    """One program per (P block, head, request): the [BP, N] state tile is read once, decayed, given
    dt x B, read out against C and written back once."""
    i_p, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_g = i_h // (H // G)
    o_p = i_p * BP + tl.arange(0, BP)
    o_n = tl.arange(0, BN)
    m_p = o_p < P
    m_n = o_n < N
    p_y = y + (i_b * H + i_h) * P + o_p

    # the inputs and per-head scalars first: their loads overlap the slot's, on which the state load waits
    b_x = tl.load(x + i_b * stride_x_b + i_h * stride_x_h + o_p, mask=m_p, other=0.0).to(tl.float32)
    b_B = tl.load(B + i_b * stride_B_b + i_g * stride_B_g + o_n, mask=m_n, other=0.0).to(tl.float32)
    b_C = tl.load(C + i_b * stride_C_b + i_g * stride_C_g + o_n, mask=m_n, other=0.0).to(tl.float32)
    b_dt = softplus(tl.load(dt + i_b * stride_dt_b + i_h).to(tl.float32) + tl.load(dt_bias + i_h).to(tl.float32))
    b_dt = tl.minimum(tl.maximum(b_dt, dt_min), dt_max)
    b_decay = tl.exp(-b_dt * tl.exp(tl.load(A_log + i_h).to(tl.float32)))
    b_D = tl.load(D + i_h).to(tl.float32)
    if HAS_Z:
        b_z = tl.load(z + i_b * stride_z_b + i_h * stride_z_h + o_p, mask=m_p, other=0.0).to(tl.float32)
    slot = tl.load(state_slots + i_b).to(tl.int64)
    if slot == pad_slot:
        tl.store(p_y, tl.zeros([BP], dtype=tl.float32).to(y.dtype.element_ty), mask=m_p)
        return

    p_s = ssm_states + slot * stride_s + i_h * (P * N) + o_p[:, None] * N + o_n[None, :]
    m_s = m_p[:, None] & m_n[None, :]
    b_s = tl.load(p_s, mask=m_s, other=0.0).to(tl.float32)  # [BP, BN]
    b_s = b_s * b_decay + (b_dt * b_x)[:, None] * b_B[None, :]
    tl.store(p_s, b_s.to(p_s.dtype.element_ty), mask=m_s)
    b_y = tl.sum(b_s * b_C[None, :], 1) + b_D * b_x
    if HAS_Z:
        b_y = b_y * b_z * tl.sigmoid(b_z)
    tl.store(p_y, b_y.to(y.dtype.element_ty), mask=m_p)


@cached_launch
@triton.jit
def _mamba1_decode_kernel(
    x,
    dt,
    A_log,
    B,
    C,
    D,
    dt_bias,
    z,
    ssm_states,
    state_slots,
    y,
    stride_x_b,
    stride_dt_b,
    stride_B_b,
    stride_C_b,
    stride_z_b,
    stride_s,
    pad_slot,
    DM: tl.constexpr,
    N: tl.constexpr,
    BD: tl.constexpr,
    BN: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    HAS_Z: tl.constexpr,
):
    """One program per (channel block, request): the [BD, N] state tile is read once, decayed by its
    own exp(dt A) per element, given dt x B, read out against C and written back once."""
    i_d, i_b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    o_d = i_d * BD + tl.arange(0, BD)
    o_n = tl.arange(0, BN)
    m_d = o_d < DM
    m_n = o_n < N
    m_s = m_d[:, None] & m_n[None, :]
    p_y = y + i_b * DM + o_d

    b_x = tl.load(x + i_b * stride_x_b + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_dt = tl.load(dt + i_b * stride_dt_b + o_d, mask=m_d, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        b_dt += tl.load(dt_bias + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_dt = softplus(b_dt)
    b_B = tl.load(B + i_b * stride_B_b + o_n, mask=m_n, other=0.0).to(tl.float32)
    b_C = tl.load(C + i_b * stride_C_b + o_n, mask=m_n, other=0.0).to(tl.float32)
    b_A = -tl.exp(tl.load(A_log + o_d[:, None] * N + o_n[None, :], mask=m_s, other=0.0).to(tl.float32))
    b_D = tl.load(D + o_d, mask=m_d, other=0.0).to(tl.float32)
    if HAS_Z:
        b_z = tl.load(z + i_b * stride_z_b + o_d, mask=m_d, other=0.0).to(tl.float32)
    slot = tl.load(state_slots + i_b).to(tl.int64)
    if slot == pad_slot:
        tl.store(p_y, tl.zeros([BD], dtype=tl.float32).to(y.dtype.element_ty), mask=m_d)
        return

    p_s = ssm_states + slot * stride_s + o_d[:, None] * N + o_n[None, :]
    b_s = tl.load(p_s, mask=m_s, other=0.0).to(tl.float32)  # [BD, BN]
    b_s = b_s * tl.exp(b_dt[:, None] * b_A) + (b_dt * b_x)[:, None] * b_B[None, :]
    tl.store(p_s, b_s.to(p_s.dtype.element_ty), mask=m_s)
    b_y = tl.sum(b_s * b_C[None, :], 1) + b_D * b_x
    if HAS_Z:
        b_y = b_y * b_z * tl.sigmoid(b_z)
    tl.store(p_y, b_y.to(y.dtype.element_ty), mask=m_d)


def _mamba2_decode_config(batch: int, H: int, P: int, N: int) -> tuple[int, int]:
    """(BP, num_warps): one warp on a [BP, N] tile of 32 state values per thread, the fastest tile (or
    within 2 % of it) at every batch on the H200 at H = 128, P = 64, N = 128: wider tiles on more warps
    are no faster, and narrower ones fall behind at large batches."""
    del batch, H
    BP = max(1, 1024 // next_power_of_2(N))
    return min(BP, next_power_of_2(P)), 1


def _mamba1_decode_config(batch: int, DM: int, N: int) -> tuple[int, int]:
    """(BD, num_warps), for DM = 8192, N = 16 on the H200: up to 8 requests the step is latency-bound
    and wants many one-warp programs ([16, N] tiles, 8 values per thread); up to 64 requests [64, N]
    tiles on 4 warps are the fastest, beyond that [128, N] tiles on 4 warps."""
    BN = next_power_of_2(N)
    BD, num_warps = (256, 1) if batch * DM <= 8 * 8192 else (1024, 4) if batch * DM <= 64 * 8192 else (2048, 4)
    return max(1, min(BD // BN, next_power_of_2(DM))), num_warps


def _check_unit_stride(**tensors):
    for name, t in tensors.items():
        if t is not None:
            assert t.stride(-1) == 1, f"{name} needs a unit stride on its last dim; got strides {t.stride()}"


def _mamba2_decode_fwd(x, dt, A_log, B, C, D, dt_bias, z, ssm_states, state_slots, pad_slot, dt_limit,
                       BP=None, num_warps=None):
    batch, H, P = x.shape
    G, N = B.shape[1:]
    assert dt.shape == (batch, H) and H % G == 0, (x.shape, dt.shape, B.shape)
    assert B.shape == (batch, G, N) and C.shape == B.shape, (B.shape, C.shape)
    assert z is None or z.shape == x.shape, (x.shape, z.shape)
    for name, p in (("A_log", A_log), ("D", D), ("dt_bias", dt_bias)):
        assert p.shape == (H,) and p.is_contiguous(), f"{name} must be a contiguous [{H}]; got {tuple(p.shape)}"
    assert ssm_states.shape[1:] == (H, P, N), f"ssm_states {tuple(ssm_states.shape)} != [S, {H}, {P}, {N}]"
    assert ssm_states.stride()[1:] == (P * N, N, 1), "ssm_states must be contiguous within a slot"
    assert state_slots.shape == (batch,)
    _check_unit_stride(x=x, dt=dt, B=B, C=C, z=z)
    y = torch.empty(batch, H, P, dtype=x.dtype, device=x.device)
    if batch == 0:
        return y
    if BP is None:
        BP, num_warps = _mamba2_decode_config(batch, H, P, N)
    zz = x if z is None else z
    grid = (cdiv(P, BP), H, batch)
    _mamba2_decode_kernel[grid](
        x, dt, A_log, B, C, D, dt_bias, zz, ssm_states, state_slots, y,
        x.stride(0), x.stride(1), dt.stride(0), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        zz.stride(0), zz.stride(1), ssm_states.stride(0), pad_slot, float(dt_limit[0]), float(dt_limit[1]),
        H=H, G=G, P=P, N=N, BP=BP, BN=next_power_of_2(N), HAS_Z=z is not None, num_warps=num_warps,
    )
    return y


def _mamba1_decode_fwd(x, dt, A_log, B, C, D, dt_bias, z, ssm_states, state_slots, pad_slot,
                       BD=None, num_warps=None):
    batch, DM = x.shape
    N = A_log.shape[1]
    assert dt.shape == x.shape and (z is None or z.shape == x.shape), (x.shape, dt.shape)
    assert B.shape == (batch, N) and C.shape == B.shape, (B.shape, C.shape)
    assert A_log.shape == (DM, N) and A_log.is_contiguous(), f"A_log must be a contiguous [{DM}, {N}]"
    for name, p in (("D", D), ("dt_bias", dt_bias)):
        assert p is None or (p.shape == (DM,) and p.is_contiguous()), f"{name} must be a contiguous [{DM}]"
    assert ssm_states.shape[1:] == (DM, N), f"ssm_states {tuple(ssm_states.shape)} != [S, {DM}, {N}]"
    assert ssm_states.stride()[1:] == (N, 1), "ssm_states must be contiguous within a slot"
    assert state_slots.shape == (batch,)
    _check_unit_stride(x=x, dt=dt, B=B, C=C, z=z)
    y = torch.empty(batch, DM, dtype=x.dtype, device=x.device)
    if batch == 0:
        return y
    if BD is None:
        BD, num_warps = _mamba1_decode_config(batch, DM, N)
    zz = x if z is None else z
    grid = (cdiv(DM, BD), batch)
    _mamba1_decode_kernel[grid](
        x, dt, A_log, B, C, D, D if dt_bias is None else dt_bias, zz, ssm_states, state_slots, y,
        x.stride(0), dt.stride(0), B.stride(0), C.stride(0), zz.stride(0), ssm_states.stride(0), pad_slot,
        DM=DM, N=N, BD=BD, BN=next_power_of_2(N), HAS_DT_BIAS=dt_bias is not None, HAS_Z=z is not None,
        num_warps=num_warps,
    )
    return y


def mamba2_decode(
    *,
    x: torch.Tensor,
    dt: torch.Tensor,
    A_log: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    z: torch.Tensor | None,
    ssm_states: torch.Tensor,
    state_slots: torch.Tensor,
    pad_slot: int = -1,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
) -> torch.Tensor:
    """Triton version of mamba2_decode_ref (same arguments and result). x, dt, B, C, z may be strided
    views (slices of one projection row) with a unit stride on their last dim; the state pool (float32
    or bfloat16) is updated in place."""
    return _mamba2_decode_fwd(x, dt, A_log, B, C, D, dt_bias, z, ssm_states, state_slots, pad_slot, dt_limit)


def mamba1_decode(
    *,
    x: torch.Tensor,
    dt: torch.Tensor,
    A_log: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor | None,
    z: torch.Tensor | None,
    ssm_states: torch.Tensor,
    state_slots: torch.Tensor,
    pad_slot: int = -1,
) -> torch.Tensor:
    """Triton version of mamba1_decode_ref (same arguments and result). x, dt, B, C, z may be strided
    views with a unit stride on their last dim; the state pool is updated in place."""
    return _mamba1_decode_fwd(x, dt, A_log, B, C, D, dt_bias, z, ssm_states, state_slots, pad_slot)


def mamba2_decode_ref(
    *,
    x: torch.Tensor,
    dt: torch.Tensor,
    A_log: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    z: torch.Tensor | None,
    ssm_states: torch.Tensor,
    state_slots: torch.Tensor,
    pad_slot: int = -1,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
) -> torch.Tensor:
    """x: [B, H, P]; dt: [B, H]; A_log, D, dt_bias: [H] float32; B, C: [B, G, N];
    z: [B, H, P] or None; ssm_states: [S, H, P, N]; state_slots: [B] int32. Returns y: [B, H, P]."""
    y = torch.zeros_like(x)
    keep = (state_slots != pad_slot).nonzero().flatten()
    if keep.numel() == 0:
        return y
    slots = state_slots[keep].long()
    rep = x.shape[1] // B.shape[1]
    dt_f = F.softplus(dt[keep].float() + dt_bias.float()).clamp(*dt_limit)  # [b, H]
    decay = torch.exp(dt_f * -torch.exp(A_log.float()))  # [b, H]
    xf = x[keep].float()
    Bf = B[keep].float().repeat_interleave(rep, dim=1)  # [b, H, N]
    Cf = C[keep].float().repeat_interleave(rep, dim=1)
    state = ssm_states[slots].float() * decay[..., None, None]
    state = state + (dt_f[..., None] * xf)[..., None] * Bf[:, :, None, :]
    out = torch.einsum("bhpn,bhn->bhp", state, Cf) + D.float()[:, None] * xf
    if z is not None:
        out = out * F.silu(z[keep].float())
    y[keep] = out.to(x.dtype)
    ssm_states[slots] = state.to(ssm_states.dtype)
    return y


def mamba1_decode_ref(
    *,
    x: torch.Tensor,
    dt: torch.Tensor,
    A_log: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor | None,
    z: torch.Tensor | None,
    ssm_states: torch.Tensor,
    state_slots: torch.Tensor,
    pad_slot: int = -1,
) -> torch.Tensor:
    """x, dt: [B, Dm]; A_log: [Dm, N] float32; B, C: [B, N]; D: [Dm]; dt_bias: [Dm] or None;
    z: [B, Dm] or None; ssm_states: [S, Dm, N]; state_slots: [B] int32. Returns y: [B, Dm]."""
    y = torch.zeros_like(x)
    keep = (state_slots != pad_slot).nonzero().flatten()
    if keep.numel() == 0:
        return y
    slots = state_slots[keep].long()
    dt_f = dt[keep].float() + (0.0 if dt_bias is None else dt_bias.float())
    dt_f = F.softplus(dt_f)  # [b, Dm]
    decay = torch.exp(dt_f[..., None] * -torch.exp(A_log.float()))  # [b, Dm, N]
    xf = x[keep].float()
    state = ssm_states[slots].float() * decay + (dt_f * xf)[..., None] * B[keep].float()[:, None, :]
    out = torch.einsum("bdn,bn->bd", state, C[keep].float()) + D.float() * xf
    if z is not None:
        out = out * F.silu(z[keep].float())
    y[keep] = out.to(x.dtype)
    ssm_states[slots] = state.to(ssm_states.dtype)
    return y
