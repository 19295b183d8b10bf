"""Gated delta rule, one decode token per request, state updated in place in the pool.

Per value head h (key head h // (Hv // Hk)), with q, k l2-normalized and q scaled:
    S  = S * exp(g)
    u  = beta * (v - k^T S)
    S  = S + k u^T
    o  = q^T S
State pool: `[num_slots, Hv, K, V]` (float32 by default).

With `z` and `norm_weight` given, the output is the mixer's gated RMSNorm of o (norms.gated_rmsnorm:
o rounded to its dtype, normalized over V, scaled, gated by silu(z)), computed in the same kernel: at
decode this saves the norm's launch, a few microseconds per layer. From NORM_BY_LAST_PROGRAM_MAX_ROWS
(request, head) rows on, one program holds a whole head; below, the programs keep the unfused kernel's
narrow V blocks and the head's last program to finish normalizes it (bench/gdn_decode_norm.py).
"""

import torch
import triton
import triton.language as tl

from triton_kernels.arrival_counters import MAX_COUNTERS, arrival_counters
from triton_kernels.cached_launch import cached_launch
from triton_kernels.gdn_gating import gdn_gate, gdn_gating_ref, l2norm, l2norm_ref
from triton_kernels.host_math import cdiv, next_power_of_2
from triton_kernels.norms import gated_rmsnorm_ref, gated_rmsnorm_tile


@triton.jit
def _gated_norm(b_x, z, norm_w, o_v, m_v, eps, V: tl.constexpr, o):
    """A head's output b_x [>= V] float32, already rounded to o's dtype (0 past V) -> its gated RMSNorm
    in float32 (norms.gated_rmsnorm_tile), z: the head's row of the gate."""
    return gated_rmsnorm_tile(b_x, tl.load(z + o_v, mask=m_v, other=0.0).to(tl.float32),
                              tl.load(norm_w + o_v, mask=m_v, other=0.0), V, eps, o.dtype.element_ty)


@cached_launch
@triton.jit
def _gdn_decode_kernel(
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    ssm_states,
    state_slots,
    z,
    norm_w,
    o,
    arrivals,
    stride_q_b,
    stride_q_h,
    stride_k_b,
    stride_k_h,
    stride_v_b,
    stride_v_h,
    stride_a_b,
    stride_b_b,
    stride_z_b,
    stride_z_h,
    stride_s,
    pad_slot,
    scale,
    eps,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    VP: tl.constexpr,
    NORM: tl.constexpr,
):
    """One program per (V block, value head, request): the [K, BV] state tile is read once,
    decayed, delta-updated and written back; the output uses the updated tile. NORM: the output is
    gated_rmsnorm(o, z) with weight norm_w and epsilon eps. With BV >= V a program holds its whole
    head and normalizes it; with narrower blocks (small batches) each program writes its block of o, and
    the head's last to arrive (arrivals[request * HV + head]) reads the row back ([VP >= V]) and
    normalizes it in place."""
    i_v, i_h, i_b = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_hk = i_h // (HV // HK)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    p_o = o + (i_b * HV + i_h) * V + o_v

    # the inputs and gates first: their loads overlap the slot's, on which the state load waits
    b_q = tl.load(q + i_b * stride_q_b + i_hk * stride_q_h + o_k, mask=m_k, other=0.0)
    b_k = tl.load(k + i_b * stride_k_b + i_hk * stride_k_h + o_k, mask=m_k, other=0.0)
    b_v = tl.load(v + i_b * stride_v_b + i_h * stride_v_h + o_v, mask=m_v, other=0.0).to(tl.float32)
    b_g, b_beta = gdn_gate(tl.load(a + i_b * stride_a_b + i_h), tl.load(b + i_b * stride_b_b + i_h),
                           tl.load(A_log + i_h).to(tl.float32), tl.load(dt_bias + i_h).to(tl.float32))
    slot = tl.load(state_slots + i_b).to(tl.int64)
    if slot == pad_slot:
        tl.store(p_o, tl.zeros([BV], dtype=tl.float32).to(o.dtype.element_ty), mask=m_v)
        return

    p_s = ssm_states + slot * stride_s + i_h * K * V + o_k[:, None] * V + o_v[None, :]
    m_s = m_k[:, None] & m_v[None, :]
    b_s = tl.load(p_s, mask=m_s, other=0.0).to(tl.float32)  # [BK, BV]
    b_q = l2norm(b_q, 0) * scale
    b_k = l2norm(b_k, 0)

    b_s = b_s * tl.exp(b_g)
    b_u = b_beta * (b_v - tl.sum(b_s * b_k[:, None], 0))  # [BV]
    b_s = b_s + b_k[:, None] * b_u[None, :]
    b_o = tl.sum(b_s * b_q[:, None], 0)
    tl.store(p_s, b_s.to(p_s.dtype.element_ty), mask=m_s)
    p_z = z + i_b * stride_z_b + i_h * stride_z_h
    if NORM and BV >= V:
        b_o = _gated_norm(tl.where(m_v, b_o.to(o.dtype.element_ty).to(tl.float32), 0.0), p_z, norm_w, o_v, m_v, eps,
                          V, o)
    tl.store(p_o, b_o.to(o.dtype.element_ty), mask=m_v)
    if NORM and BV < V:
        tl.debug_barrier()  # every thread's block of o is written before the count says so
        p_count = arrivals + i_b * HV + i_h
        if tl.atomic_add(p_count, 1, sem="acq_rel") == tl.num_programs(0) - 1:  # the head's other blocks are in
            o_w = tl.arange(0, VP)
            m_w = o_w < V
            p_row = o + (i_b * HV + i_h) * V + o_w
            b_x = tl.load(p_row, mask=m_w, other=0.0, cache_modifier=".cg").to(tl.float32)
            tl.store(p_row, _gated_norm(b_x, p_z, norm_w, o_w, m_w, eps, V, o).to(o.dtype.element_ty), mask=m_w)
            tl.atomic_xchg(p_count, 0)


def _decode_config(batch: int, HV: int, K: int, V: int, whole_heads: bool = False) -> tuple[int, int]:
    """(BV, num_warps), from the H200 sweeps at K = V = 128: a few hundred (request, head) rows are
    latency-bound and want many one-warp programs ([K, 16] tiles at 32 rows, [K, 32] at 256); from
    about a thousand rows on, the copy bandwidth wants [K, 64] tiles on 4 warps. Wider K adds warps,
    at most 128 state values per thread. whole_heads (the fused norm): BV covers V."""
    BK = next_power_of_2(K)
    rows = batch * HV
    BV, num_warps = (16, 1) if rows < 128 else (32, 1) if rows < 1024 else (64, 4)
    BV = max(8, next_power_of_2(V)) if whole_heads else min(BV, max(8, next_power_of_2(V)))
    return BV, max(num_warps, min(8, BK * BV // (32 * 128)))


# Fewer (request, head) rows than this take the fused norm at the unfused kernel's tiles ([K, 16], one warp),
# the head's last program normalizing it: at small batches the many narrow programs beat whole heads per
# program, at larger ones whole heads win
NORM_BY_LAST_PROGRAM_MAX_ROWS = 128


def _gdn_decode_fwd(q, k, v, a, b, A_log, dt_bias, ssm_states, state_slots, pad_slot, scale,
                    z=None, norm_weight=None, norm_eps=1e-6, BV=None, num_warps=None):
    B, HK, K = q.shape
    HV, V = v.shape[1:]
    assert k.shape == q.shape and v.shape[0] == B and HV % HK == 0, (q.shape, k.shape, v.shape)
    assert a.shape == (B, HV) and b.shape == (B, HV), (a.shape, b.shape)
    assert A_log.shape == (HV,) and dt_bias.shape == (HV,)
    assert ssm_states.shape[1:] == (HV, K, V), f"ssm_states {tuple(ssm_states.shape)} != [S, {HV}, {K}, {V}]"
    assert ssm_states.stride()[1:] == (K * V, V, 1), "ssm_states must be contiguous within a slot"
    assert state_slots.shape == (B,)
    norm = z is not None
    assert not norm or (z.shape == v.shape and norm_weight is not None and norm_weight.shape == (V,)), \
        f"z {None if z is None else tuple(z.shape)} must be shaped as v {tuple(v.shape)}, with a [{V}] norm weight"
    for name, x in (("q", q), ("k", k), ("v", v), ("a", a), ("b", b), ("z", z if norm else v)):
        assert x.stride(-1) == 1, f"{name} needs a unit stride on its last dim; got strides {x.stride()}"
    o = torch.empty(B, HV, V, dtype=v.dtype, device=v.device)
    if B == 0:
        return o
    if BV is None:
        by_last = norm and B * HV < NORM_BY_LAST_PROGRAM_MAX_ROWS
        BV, num_warps = _decode_config(B, HV, K, V, whole_heads=norm and not by_last)
    counters = B * HV if norm and BV < V else 1  # (the last-arriver norm's)
    assert counters <= MAX_COUNTERS, f"{B} x {HV} heads normalized by their last program: too many counters"
    zz = z if norm else v  # (unread without the norm)
    grid = (cdiv(V, BV), HV, B)
    _gdn_decode_kernel[grid](
        q, k, v, a, b, A_log, dt_bias, ssm_states, state_slots, zz, norm_weight if norm else v, o,
        arrival_counters(o.device, counters), q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
        v.stride(1), a.stride(0), b.stride(0), zz.stride(0), zz.stride(1), ssm_states.stride(0), pad_slot, scale,
        norm_eps, HK=HK, HV=HV, K=K, V=V, BK=next_power_of_2(K), BV=BV, VP=next_power_of_2(V),
        NORM=norm, num_warps=num_warps,
    )
    return o


def gdn_decode(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_states: torch.Tensor,
    state_slots: torch.Tensor,
    pad_slot: int = -1,
    scale: float | None = None,
    z: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
) -> torch.Tensor:
    """Triton version of gdn_decode_ref (same arguments and result). q, k, v, a, b, z may be strided
    views (e.g. slices of one projection output); the state pool is updated in place."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _gdn_decode_fwd(q, k, v, a, b, A_log, dt_bias, ssm_states, state_slots, pad_slot, scale,
                           z=z, norm_weight=norm_weight, norm_eps=norm_eps)



def gdn_decode_ref(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_states: torch.Tensor,
    state_slots: torch.Tensor,
    pad_slot: int = -1,
    scale: float | None = None,
    z: torch.Tensor | None = None,
    norm_weight: torch.Tensor | None = None,
    norm_eps: float = 1e-6,
) -> torch.Tensor:
    """q, k: [B, Hk, K]; v: [B, Hv, V]; a, b: [B, Hv]; ssm_states: [S, Hv, K, V];
    state_slots: [B]. Rows whose slot is `pad_slot` are skipped. Returns o: [B, Hv, V], or with z
    [B, Hv, V] and norm_weight [V], gated_rmsnorm_ref(o, z) (0 in skipped rows)."""
    n_rep = v.shape[1] // q.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if z is not None:
        o = gdn_decode_ref(q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, ssm_states=ssm_states,
                           state_slots=state_slots, pad_slot=pad_slot, scale=scale)
        return gated_rmsnorm_ref(x=o, z=z, weight=norm_weight, eps=norm_eps)
    o = torch.zeros_like(v)
    keep = (state_slots != pad_slot).nonzero().flatten()
    if keep.numel() == 0:
        return o
    slots = state_slots[keep].long()
    g, beta = gdn_gating_ref(a[keep], b[keep], A_log, dt_bias)  # [b, Hv]
    qf = l2norm_ref(q[keep]).repeat_interleave(n_rep, dim=1) * scale  # [b, Hv, K]
    kf = l2norm_ref(k[keep]).repeat_interleave(n_rep, dim=1)
    vf = v[keep].float()
    state = ssm_states[slots].float() * g.exp()[..., None, None]  # [b, Hv, K, V]
    u = beta[..., None] * (vf - torch.einsum("bhk,bhkv->bhv", kf, state))
    state = state + kf[..., :, None] * u[..., None, :]
    o[keep] = torch.einsum("bhk,bhkv->bhv", qf, state).to(v.dtype)
    ssm_states[slots] = state.to(ssm_states.dtype)
    return o
