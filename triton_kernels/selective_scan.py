"""Mamba-1 (selective scan) prefill over packed varlen sequences, states in pool slots.

The recurrence is the one of `ssm_step.mamba1_decode_ref`, run over every token of each
sequence; sequence i owns tokens cu_seqlens[i]:cu_seqlens[i+1] and slot state_slots[i], starts
from the slot's state when has_initial_state[i] (else zeros) and writes its final state back.
Optional snapshots (snap_pos, snap_slots, as in ssd_chunk.mamba2_prefill) also write the state
after the first p tokens of a sequence to another slot, for the prefix cache.
`mamba1_prefill` runs it in time order, one program per (channel block, sequence) with the
[BD, N] state in registers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.host_math import cdiv, next_power_of_2
from triton_kernels.ssd_chunk import check_snapshots
from triton_kernels.ssm_step import softplus
from triton_kernels.varlen import snapshot_cuts


@triton.jit
def _load_token(x, dt, B, C, z, dt_bias, t, stride_x_t, stride_dt_t, stride_B_t, stride_C_t, stride_z_t,
                o_d, m_d, o_n, m_n, HAS_DT_BIAS: tl.constexpr, HAS_Z: tl.constexpr):
    """Token t's (int64) x, softplus(dt + dt_bias) ([BD]), B, C ([BN]) and z ([BD], zeros without z),
    in float32."""
    b_x = tl.load(x + t * stride_x_t + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_dt = tl.load(dt + t * stride_dt_t + o_d, mask=m_d, other=0.0).to(tl.float32)
    if HAS_DT_BIAS:
        b_dt += tl.load(dt_bias + o_d, mask=m_d, other=0.0).to(tl.float32)
    b_B = tl.load(B + t * stride_B_t + o_n, mask=m_n, other=0.0).to(tl.float32)
    b_C = tl.load(C + t * stride_C_t + o_n, mask=m_n, other=0.0).to(tl.float32)
    if HAS_Z:
        b_z = tl.load(z + t * stride_z_t + o_d, mask=m_d, other=0.0).to(tl.float32)
    else:
        b_z = tl.zeros_like(b_x)
    return b_x, softplus(b_dt), b_B, b_C, b_z


@cached_launch
@triton.jit(do_not_specialize=["num_cuts"])
def _mamba1_prefill_kernel(
    x,
    dt,
    A_log,
    B,
    C,
    D,
    dt_bias,
    z,
    ssm_states,
    cu_seqlens,
    state_slots,
    has_initial_state,
    snap_pos,
    snap_slots,
    y,
    stride_x_t,
    stride_dt_t,
    stride_B_t,
    stride_C_t,
    stride_z_t,
    stride_s,
    num_cuts,
    DM: tl.constexpr,
    N: tl.constexpr,
    BD: tl.constexpr,
    BN: tl.constexpr,
    HAS_DT_BIAS: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_SNAP: tl.constexpr,
):
    """One program per (channel block, sequence), in time order: the [BD, N] state stays in registers
    from the slot's state (or zeros) to the final state, written back once. Token t + 1's inputs are
    loaded before token t is computed, so their latency hides behind the step. With HAS_SNAP, row
    i_n of snap_pos / snap_slots ([num_seqs, num_cuts] int32, cuts strictly ascending, -1 after the
    last) stores the state after the first p tokens in slot snap_slots: a scalar compare per token
    and one [BD, N] store per cut."""
    i_d, i_n = tl.program_id(0), tl.program_id(1)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    slot = tl.load(state_slots + i_n).to(tl.int64)
    o_d = i_d * BD + tl.arange(0, BD)
    o_n = tl.arange(0, BN)
    m_d = o_d < DM
    m_n = o_n < N
    m_s = m_d[:, None] & m_n[None, :]
    p_s = ssm_states + slot * stride_s + o_d[:, None] * N + o_n[None, :]

    b_s = tl.zeros([BD, BN], dtype=tl.float32)
    if tl.load(has_initial_state + i_n):
        b_s = tl.load(p_s, mask=m_s, other=0.0).to(tl.float32)
    b_A = -tl.exp(tl.load(A_log + o_d[:, None] * N + o_n[None, :], mask=m_s, other=0.0).to(tl.float32))
    b_D = tl.load(D + o_d, mask=m_d, other=0.0).to(tl.float32)
    if HAS_SNAP:
        snap_pos += i_n * num_cuts
        snap_slots += i_n * num_cuts
        i_cut = 0
        cut = tl.load(snap_pos)  # tokens before the next cut; -1 (never reached) once none is left
    # the prefetch index stays inside the packed tokens: the last token reloads itself, and an empty
    # sequence reads a neighbour's token that no step uses
    t_first = tl.maximum(tl.minimum(bos, eos - 1), 0)
    b_x, b_dt, b_B, b_C, b_z = _load_token(x, dt, B, C, z, dt_bias, t_first, stride_x_t, stride_dt_t, stride_B_t,
                                           stride_C_t, stride_z_t, o_d, m_d, o_n, m_n, HAS_DT_BIAS, HAS_Z)
    for i in range(eos - bos):
        t = bos + i
        n_x, n_dt, n_B, n_C, n_z = _load_token(x, dt, B, C, z, dt_bias, tl.minimum(t + 1, eos - 1), stride_x_t,
                                               stride_dt_t, stride_B_t, stride_C_t, stride_z_t, o_d, m_d, o_n, m_n,
                                               HAS_DT_BIAS, HAS_Z)
        b_s = b_s * tl.exp(b_dt[:, None] * b_A) + (b_dt * b_x)[:, None] * b_B[None, :]
        b_y = tl.sum(b_s * b_C[None, :], 1) + b_D * b_x
        if HAS_Z:
            b_y = b_y * b_z * tl.sigmoid(b_z)
        tl.store(y + t * DM + o_d, b_y.to(y.dtype.element_ty), mask=m_d)
        if HAS_SNAP:  # noqa: SIM102 (compiled out without snapshots, where cut is undefined)
            if i + 1 == cut:
                p_c = ssm_states + tl.load(snap_slots + i_cut).to(tl.int64) * stride_s + o_d[:, None] * N + o_n[None, :]
                tl.store(p_c, b_s.to(p_c.dtype.element_ty), mask=m_s)
                i_cut += 1
                cut = tl.load(snap_pos + i_cut, mask=i_cut < num_cuts, other=-1)
        b_x, b_dt, b_B, b_C, b_z = n_x, n_dt, n_B, n_C, n_z
    tl.store(p_s, b_s.to(p_s.dtype.element_ty), mask=m_s)


def _prefill_config(num_seqs: int, DM: int, N: int) -> tuple[int, int]:
    """(BD, num_warps): one warp per (channel block, sequence). The steps of a program form a serial
    chain bound by load latency, so the time is set by how many chains run side by side: about 2048
    programs (one wave on the H200 at DM = 8192, N = 16) beat fewer, wider programs and a second wave.
    Tokens load one at a time: picking each token's column out of loaded 16-token tiles costs more,
    with several sequences, than the latency it hides."""
    BD = next_power_of_2(cdiv(num_seqs * DM, 2048))
    BD = min(max(BD, 8), 64, max(1, 2048 // next_power_of_2(N)), next_power_of_2(DM))
    return BD, 1


def _mamba1_prefill_fwd(x, dt, A_log, B, C, D, dt_bias, z, ssm_states, cu_seqlens, state_slots, has_initial_state,
                        snap_pos=None, snap_slots=None, BD=None, num_warps=None):
    T, DM = x.shape
    N = A_log.shape[1]
    num_seqs = state_slots.shape[0]
    assert dt.shape == x.shape and (z is None or z.shape == x.shape), (x.shape, dt.shape)
    assert B.shape == (T, N) and C.shape == B.shape, (B.shape, C.shape)
    assert A_log.shape == (DM, N) and A_log.is_contiguous(), f"A_log must be a contiguous [{DM}, {N}]"
    for name, p in (("D", D), ("dt_bias", dt_bias)):
        assert p is None or (p.shape == (DM,) and p.is_contiguous()), f"{name} must be a contiguous [{DM}]"
    assert ssm_states.shape[1:] == (DM, N), f"ssm_states {tuple(ssm_states.shape)} != [S, {DM}, {N}]"
    assert ssm_states.stride()[1:] == (N, 1), "ssm_states must be contiguous within a slot"
    assert cu_seqlens.shape == (num_seqs + 1,) and has_initial_state.shape == (num_seqs,)
    for name, t in (("x", x), ("dt", dt), ("B", B), ("C", C), ("z", z)):
        assert t is None or t.stride(-1) == 1, f"{name} needs a unit stride on its last dim; got {t.stride()}"
    num_cuts = check_snapshots(snap_pos, snap_slots, num_seqs)
    y = torch.empty(T, DM, dtype=x.dtype, device=x.device)
    if T == 0 or num_seqs == 0:
        return y
    if BD is None:
        BD, num_warps = _prefill_config(num_seqs, DM, N)
    zz = x if z is None else z
    _mamba1_prefill_kernel[(cdiv(DM, BD), num_seqs)](
        x, dt, A_log, B, C, D, D if dt_bias is None else dt_bias, zz, ssm_states, cu_seqlens, state_slots,
        has_initial_state, state_slots if snap_pos is None else snap_pos,
        state_slots if snap_slots is None else snap_slots, y, x.stride(0), dt.stride(0), B.stride(0), C.stride(0),
        zz.stride(0), ssm_states.stride(0), num_cuts, DM=DM, N=N, BD=BD, BN=next_power_of_2(N),
        HAS_DT_BIAS=dt_bias is not None, HAS_Z=z is not None, HAS_SNAP=snap_pos is not None, num_warps=num_warps,
    )
    return y


def mamba1_prefill(
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
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    snap_pos: torch.Tensor | None = None,
    snap_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton version of mamba1_prefill_ref (same arguments and result). x, dt, B, C, z may be strided
    views with a unit stride on their last dim; the final states (and snapshots) are written to the
    pool in place. A snapshot costs the store of its state, written as the scan passes the cut."""
    return _mamba1_prefill_fwd(x, dt, A_log, B, C, D, dt_bias, z, ssm_states, cu_seqlens, state_slots,
                               has_initial_state, snap_pos, snap_slots)


def mamba1_prefill_ref(
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
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    snap_pos: torch.Tensor | None = None,
    snap_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """x, dt: [T, Dm]; A_log: [Dm, N] float32; B, C: [T, N]; D: [Dm]; dt_bias: [Dm] or None;
    z: [T, Dm] or None; ssm_states: [S, Dm, N]; cu_seqlens: [num_seqs + 1]; state_slots,
    has_initial_state: [num_seqs]. Returns y: [T, Dm].

    snap_pos, snap_slots: [num_seqs, cuts] int32 or both None. snap_pos[i, c] = p (1 <= p <= the
    sequence's length) writes the state after its first p tokens to ssm_states[snap_slots[i, c]];
    -1 is no cut, valid cuts come first in strictly ascending order. Snapshot slots must differ from
    each other and from state_slots (else the result depends on the order of the writes)."""
    A = -torch.exp(A_log.float())
    dt_all = F.softplus(dt.float() + (0.0 if dt_bias is None else dt_bias.float()))  # [T, Dm]
    y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    bounds = cu_seqlens.tolist()
    cuts = snapshot_cuts(snap_pos, snap_slots, bounds)
    for i, slot in enumerate(state_slots.tolist()):
        start, end = bounds[i], bounds[i + 1]
        state = ssm_states[slot].float() if bool(has_initial_state[i]) else ssm_states.new_zeros(
            ssm_states.shape[1:], dtype=torch.float32)
        for t in range(start, end):
            d, xt = dt_all[t], x[t].float()
            state = state * torch.exp(d[:, None] * A) + (d * xt)[:, None] * B[t].float()[None, :]
            y[t] = state @ C[t].float() + D.float() * xt
            if t + 1 - start in cuts[i]:
                ssm_states[cuts[i][t + 1 - start]] = state.to(ssm_states.dtype)
        ssm_states[slot] = state.to(ssm_states.dtype)
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(x.dtype)
