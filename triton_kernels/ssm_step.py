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
