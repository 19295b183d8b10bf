"""Chunked gated delta rule over packed varlen tokens (prefill and chunked prefill).

Within a chunk of C tokens with incoming state S0 [K, V] and gamma = cumsum(g):
    A[t, i] = beta_t exp(gamma_t - gamma_i) k_t.k_i   (i < t),  T = I + A
    W  = T^-1 (beta exp(gamma) K),   U = T^-1 (beta V) - W S0
    O  = (exp(gamma) Q) S0 + ((QK^T) * exp(gamma_t - gamma_i) * [i <= t]) U
    S1 = exp(gamma_C) S0 + (exp(gamma_C - gamma) K)^T U
which is the token-by-token recurrence of gdn_recurrent.py, computed with matmuls.
"""

import torch

from triton_kernels.gdn_gating import gdn_gating_ref, l2norm_ref

CHUNK_SIZE = 64


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
) -> torch.Tensor:
    """q, k: [T, Hk, K]; v: [T, Hv, V]; a, b: [T, Hv]; ssm_states: [S, Hv, K, V];
    cu_seqlens: [B+1]; state_slots, has_initial_state: [B]. Initial states are read from the
    slots where has_initial_state (zeros elsewhere); final states are written back.
    Returns o: [T, Hv, V] in v's dtype."""
    n_rep = v.shape[1] // q.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    g, beta = gdn_gating_ref(a, b, A_log, dt_bias)  # [T, Hv]
    qf = (l2norm_ref(q).repeat_interleave(n_rep, dim=1) * scale).transpose(0, 1)  # [Hv, T, K]
    kf = l2norm_ref(k).repeat_interleave(n_rep, dim=1).transpose(0, 1)
    vf, g, beta = v.float().transpose(0, 1), g.t(), beta.t()  # [Hv, T, V], [Hv, T]
    o = torch.empty_like(v)
    bounds = cu_seqlens.tolist()
    for i, slot in enumerate(state_slots.tolist()):
        s, e = bounds[i], bounds[i + 1]
        if bool(has_initial_state[i]):
            state = ssm_states[slot].float()
        else:
            state = torch.zeros(ssm_states.shape[1:], dtype=torch.float32, device=v.device)
        out, state = _chunked_delta_rule(qf[:, s:e], kf[:, s:e], vf[:, s:e], g[:, s:e], beta[:, s:e],
                                         state, chunk_size)
        o[s:e] = out.transpose(0, 1).to(v.dtype)
        ssm_states[slot] = state.to(ssm_states.dtype)
    return o
