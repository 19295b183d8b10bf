"""Gated delta rule, one decode token per request, state updated in place in the pool.

Per value head h (key head h // (Hv // Hk)), with q, k l2-normalized and q scaled:
    S  = S * exp(g)
    u  = beta * (v - k^T S)
    S  = S + k u^T
    o  = q^T S
State pool: `[num_slots, Hv, K, V]` (float32 by default).
"""

import torch

from triton_kernels.gdn_gating import gdn_gating_ref, l2norm_ref


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
) -> torch.Tensor:
    """q, k: [B, Hk, K]; v: [B, Hv, V]; a, b: [B, Hv]; ssm_states: [S, Hv, K, V];
    state_slots: [B]. Rows whose slot is `pad_slot` are skipped. Returns o: [B, Hv, V]."""
    n_rep = v.shape[1] // q.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
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
