"""Chunked gated delta rule over packed varlen tokens (prefill and chunked prefill).

Within a chunk of C tokens with incoming state S0 [K, V] and gamma = cumsum(g):
    A[t, i] = beta_t exp(gamma_t - gamma_i) k_t.k_i   (i < t),  T = I + A
    W  = T^-1 (beta exp(gamma) K),   U = T^-1 (beta V) - W S0
    O  = (exp(gamma) Q) S0 + ((QK^T) * exp(gamma_t - gamma_i) * [i <= t]) U
    S1 = exp(gamma_C) S0 + (exp(gamma_C - gamma) K)^T U
which is the token-by-token recurrence of gdn_recurrent.py, computed with matmuls. The state
after p tokens, for a p inside a chunk, is S1 of the chunk truncated at p (tokens >= p masked out,
gamma_C replaced by gamma at token p - 1): the prefix-cache snapshots of a prefill step.
"""

import torch

from triton_kernels.gdn_chunk_parts import (
    _gdn_chunk_intra_kernel,
    _gdn_chunk_output_kernel,
    _gdn_chunk_state_kernel,
)
from triton_kernels.gdn_gating import gdn_gating_ref, l2norm_ref
from triton_kernels.host_math import cdiv, next_power_of_2
from triton_kernels.varlen import num_virtual_chunks, snapshot_cuts

CHUNK_SIZE = 64


def _state_config(num_seqs: int, HV: int, V: int, cuts: bool = False) -> tuple[int, int, int]:
    """(BV, num_warps, num_stages) of the sequential state kernel, from the H200 sweeps: [K, 64] state
    blocks on 4 warps when the (sequence, head, V block) programs fill the GPU; else [K, 32] blocks
    with 3 stages of prefetch (one program per SM at 32 heads: the serial chain and the re-reads of
    w and k by every V block bound it, finer blocks only add re-reads). Chosen by hand, not
    autotuned: the kernel updates the state pool in place, so the autotuner's repeated runs would
    corrupt it. With snapshot cuts the [K, 64] blocks take 8 warps: on 4 the cut branch spills (ptxas)."""
    if num_seqs * HV * cdiv(V, 64) >= 256:
        return min(64, max(16, next_power_of_2(V))), 8 if cuts else 4, 2
    return min(32, max(16, next_power_of_2(V))), 4, 3


def _check_snapshot_args(snap_pos, snap_slots, num_seqs: int) -> bool:
    """Whether a call takes snapshots; asserts the shapes of snap_pos and snap_slots [N, C]."""
    if snap_pos is None and snap_slots is None:
        return False
    assert snap_pos is not None and snap_slots is not None, "snap_pos and snap_slots are given together"
    assert snap_pos.ndim == 2 and snap_pos.shape[0] == num_seqs and snap_pos.shape[1] >= 1, (
        f"snap_pos {tuple(snap_pos.shape)} != [{num_seqs}, C >= 1]")
    assert snap_slots.shape == snap_pos.shape, f"snap_slots {tuple(snap_slots.shape)} != {tuple(snap_pos.shape)}"
    for name, x in (("snap_pos", snap_pos), ("snap_slots", snap_slots)):
        assert x.dtype == torch.int32 and x.is_contiguous(), f"{name} must be a contiguous int32 tensor"
    return True


def check_varlen_args(q, k, v, a, b, A_log, dt_bias, ssm_states, cu_seqlens, state_slots, has_initial_state,
                      snap_pos, snap_slots) -> tuple[int, int, int, int, int, int, bool]:
    """The shapes of a packed varlen GDN call (gdn_prefill's and gdn_short_rows.gdn_rows' arguments), checked:
    (T, HK, K, HV, V, N, whether it takes snapshots)."""
    T, HK, K = q.shape
    HV, V = v.shape[1:]
    N = state_slots.shape[0]
    assert k.shape == q.shape and v.shape[0] == T and HV % HK == 0, (q.shape, k.shape, v.shape)
    assert a.shape == (T, HV) and b.shape == (T, HV), (a.shape, b.shape)
    assert A_log.shape == (HV,) and dt_bias.shape == (HV,)
    assert ssm_states.shape[1:] == (HV, K, V), f"ssm_states {tuple(ssm_states.shape)} != [S, {HV}, {K}, {V}]"
    assert ssm_states.stride()[1:] == (K * V, V, 1), "ssm_states must be contiguous within a slot"
    assert cu_seqlens.shape == (N + 1,) and has_initial_state.shape == (N,)
    for name, x in (("q", q), ("k", k), ("v", v), ("a", a), ("b", b)):
        assert x.stride(-1) == 1, f"{name} needs a unit stride on its last dim; got strides {x.stride()}"
    return T, HK, K, HV, V, N, _check_snapshot_args(snap_pos, snap_slots, N)


def _gdn_prefill_fwd(q, k, v, a, b, A_log, dt_bias, ssm_states, cu_seqlens, state_slots, has_initial_state,
                     scale, snap_pos=None, snap_slots=None, state_config=None):
    T, HK, K, HV, V, N, has_snap = check_varlen_args(q, k, v, a, b, A_log, dt_bias, ssm_states, cu_seqlens,
                                                     state_slots, has_initial_state, snap_pos, snap_slots)
    assert q.dtype == k.dtype == v.dtype, (q.dtype, k.dtype, v.dtype)
    assert 16 <= K <= 128 and 16 <= V <= 256, f"head dims K={K}, V={V}: supported are 16 <= K <= 128, 16 <= V <= 256"
    o = torch.empty(T, HV, V, dtype=v.dtype, device=v.device)
    if N == 0:
        return o
    BT, BK = CHUNK_SIZE, next_power_of_2(K)
    prec = "tf32x3" if q.dtype == torch.float32 else "tf32"
    NC = num_virtual_chunks(T, N, BT)
    g_cum = torch.empty(T, HV, dtype=torch.float32, device=v.device)
    kn = torch.empty(T, HK, K, dtype=k.dtype, device=k.device)
    w = torch.empty(T, HV, K, dtype=k.dtype, device=k.device)
    u = torch.empty(T, HV, V, dtype=v.dtype, device=v.device)
    v_new = torch.empty(T, HV, V, dtype=v.dtype, device=v.device)
    h = torch.empty(NC, HV, K, V, dtype=k.dtype, device=k.device)

    _gdn_chunk_intra_kernel[(NC * HV,)](
        k, v, a, b, A_log, dt_bias, g_cum, kn, w, u, cu_seqlens,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), b.stride(0), N,
        HK=HK, HV=HV, K=K, V=V, BT=BT, BK=BK, BLOCK_N=64, PREC=prec,
    )
    BV_state, num_warps, num_stages = state_config or _state_config(N, HV, V, has_snap)
    _gdn_chunk_state_kernel[(cdiv(V, BV_state), HV, N)](
        kn, w, u, g_cum, h, v_new, ssm_states, cu_seqlens, state_slots, has_initial_state,
        snap_pos if has_snap else state_slots, snap_slots if has_snap else state_slots,
        ssm_states.stride(0), snap_pos.shape[1] if has_snap else 1,
        HK=HK, HV=HV, K=K, V=V, BT=BT, BK=min(BK, 64), BV=BV_state, PREC=prec, HAS_SNAP=has_snap,
        num_warps=num_warps, num_stages=num_stages,
    )
    _gdn_chunk_output_kernel[lambda meta: (NC * HV * cdiv(V, meta["BV"]),)](
        q, kn, v_new, h, g_cum, o, cu_seqlens, q.stride(0), q.stride(1), scale, N,
        HK=HK, HV=HV, K=K, V=V, BT=BT, BK=BK, BLOCK_N=64, PREC=prec,
    )
    return o


def gdn_prefill(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    scale: float | None = None,
    chunk_size: int = CHUNK_SIZE,
    snap_pos: torch.Tensor | None = None,
    snap_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton version of gdn_prefill_ref (same arguments and result). q, k, v, a, b may be strided
    views; initial states come from the pool slots and final states go back in place. The result
    does not depend on chunk_size, which the kernels fix at 64. Scratch per call, in the input dtype:
    w, u, v_new, kn and one [K, V] state per chunk and value head, about 45 KB per token at
    Qwen3.5-9B shapes (1.5 GB for 32768 tokens). Snapshots cost no host work: the sequential
    state kernel writes them, each with one more [K, 64] x [64, V] matmul (the chunk's keys times
    its truncated V_new) and a [K, V] store per head; without snap_pos it is compiled without them."""
    if chunk_size != CHUNK_SIZE:
        raise ValueError(f"gdn_prefill runs chunks of {CHUNK_SIZE} tokens; got chunk_size={chunk_size}")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _gdn_prefill_fwd(q, k, v, a, b, A_log, dt_bias, ssm_states, cu_seqlens, state_slots,
                            has_initial_state, scale, snap_pos, snap_slots)


def _chunked_delta_rule(q, k, v, g, beta, state, chunk_size):
    """One sequence. q, k: [H, L, K] (normalized, q scaled); v: [H, L, V]; g, beta: [H, L];
    state: [H, K, V] float32. Returns o: [H, L, V] and the final state."""
    length = q.shape[1]
    o = torch.empty_like(v)
    for start in range(0, length, chunk_size):
        end = min(start + chunk_size, length)
        qc, kc, vc = q[:, start:end], k[:, start:end], v[:, start:end]
        gamma = g[:, start:end].cumsum(-1)  # [H, C]
        bc = beta[:, start:end, None]
        decay = (gamma[:, :, None] - gamma[:, None, :]).tril().exp().tril()  # [H, C, C], i <= t
        eye = torch.eye(end - start, dtype=q.dtype, device=q.device)
        t_mat = eye + (bc * (kc @ kc.transpose(1, 2)) * decay).tril(-1)
        w = torch.linalg.solve_triangular(t_mat, bc * gamma.exp()[..., None] * kc, upper=False,
                                          unitriangular=True)
        u = torch.linalg.solve_triangular(t_mat, bc * vc, upper=False, unitriangular=True) - w @ state
        o[:, start:end] = (gamma.exp()[..., None] * qc) @ state + ((qc @ kc.transpose(1, 2)) * decay) @ u
        tail = (gamma[:, -1:] - gamma).exp()[..., None]  # [H, C, 1]
        state = gamma[:, -1].exp()[:, None, None] * state + (tail * kc).transpose(1, 2) @ u
    return o, state


def gdn_prefill_ref(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    scale: float | None = None,
    chunk_size: int = CHUNK_SIZE,
    snap_pos: torch.Tensor | None = None,
    snap_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """q, k: [T, Hk, K]; v: [T, Hv, V]; a, b: [T, Hv]; ssm_states: [S, Hv, K, V];
    cu_seqlens: [B+1]; state_slots, has_initial_state: [B]. Initial states are read from the
    slots where has_initial_state (zeros elsewhere); final states are written back.
    snap_pos, snap_slots: [B, C] int32 or None. snap_pos[n, c] = p (1 <= p <= length of sequence
    n in this call; ascending, then -1) asks for the state after the sequence's first p tokens of
    this call in ssm_states[snap_slots[n, c]]; slots of -1 cuts are ignored. Snapshot slots must
    differ from each other and from state_slots. Returns o: [T, Hv, V] in v's dtype."""
    n_rep = v.shape[1] // q.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    g, beta = gdn_gating_ref(a, b, A_log, dt_bias)  # [T, Hv]
    qf = (l2norm_ref(q).repeat_interleave(n_rep, dim=1) * scale).transpose(0, 1)  # [Hv, T, K]
    kf = l2norm_ref(k).repeat_interleave(n_rep, dim=1).transpose(0, 1)
    vf, g, beta = v.float().transpose(0, 1), g.t(), beta.t()  # [Hv, T, V], [Hv, T]
    o = torch.empty_like(v)
    bounds = cu_seqlens.tolist()
    cuts = snapshot_cuts(snap_pos, snap_slots, bounds)
    for i, slot in enumerate(state_slots.tolist()):
        s, e = bounds[i], bounds[i + 1]
        if bool(has_initial_state[i]):
            state = ssm_states[slot].float()
        else:
            state = torch.zeros(ssm_states.shape[1:], dtype=torch.float32, device=v.device)
        # snapshots: the pieces between cuts one after another, as a server that snapshots and goes on
        piece, start = state, s
        for p, snap_slot in cuts[i].items():
            _, piece = _chunked_delta_rule(qf[:, start : s + p], kf[:, start : s + p], vf[:, start : s + p],
                                           g[:, start : s + p], beta[:, start : s + p], piece, chunk_size)
            ssm_states[snap_slot] = piece.to(ssm_states.dtype)
            start = s + p
        out, state = _chunked_delta_rule(qf[:, s:e], kf[:, s:e], vf[:, s:e], g[:, s:e], beta[:, s:e],
                                         state, chunk_size)
        o[s:e] = out.transpose(0, 1).to(v.dtype)
        ssm_states[slot] = state.to(ssm_states.dtype)
    return o
