"""Mamba-1 (selective scan) prefill over packed varlen sequences, states in pool slots.

The recurrence is the one of `ssm_step.mamba1_decode_ref`, run over every token of each
sequence; sequence i owns tokens cu_seqlens[i]:cu_seqlens[i+1] and slot state_slots[i], starts
from the slot's state when has_initial_state[i] (else zeros) and writes its final state back.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
) -> torch.Tensor:
    """x, dt: [T, Dm]; A_log: [Dm, N] float32; B, C: [T, N]; D: [Dm]; dt_bias: [Dm] or None;
    z: [T, Dm] or None; ssm_states: [S, Dm, N]; cu_seqlens: [num_seqs + 1]; state_slots,
    has_initial_state: [num_seqs]. Returns y: [T, Dm]."""
    A = -torch.exp(A_log.float())
    dt_all = F.softplus(dt.float() + (0.0 if dt_bias is None else dt_bias.float()))  # [T, Dm]
    y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    bounds = cu_seqlens.tolist()
    for i, slot in enumerate(state_slots.tolist()):
        start, end = bounds[i], bounds[i + 1]
        state = ssm_states[slot].float() if bool(has_initial_state[i]) else ssm_states.new_zeros(
            ssm_states.shape[1:], dtype=torch.float32)
        for t in range(start, end):
            d, xt = dt_all[t], x[t].float()
            state = state * torch.exp(d[:, None] * A) + (d * xt)[:, None] * B[t].float()[None, :]
            y[t] = state @ C[t].float() + D.float() * xt
        ssm_states[slot] = state.to(ssm_states.dtype)
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(x.dtype)
