"""Mamba2 prefill (SSD) over packed varlen sequences, states read from and written to pool slots.

The recurrence is the one of `ssm_step.mamba2_decode_ref`, run over every token of each
sequence; sequence i owns tokens cu_seqlens[i]:cu_seqlens[i+1] and slot state_slots[i], and
starts from that slot's state when has_initial_state[i] (else from zeros). The final state of
each sequence is written back to its slot.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def mamba2_prefill_ref(
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
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    chunk_size: int = 256,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
) -> torch.Tensor:
    """x: [T, H, P]; dt: [T, H]; A_log, D, dt_bias: [H] float32; B, C: [T, G, N]; z: [T, H, P] or
    None; ssm_states: [S, H, P, N]; cu_seqlens: [num_seqs + 1]; state_slots, has_initial_state:
    [num_seqs]. `chunk_size` is the kernel's tiling (the reference is sequential). Returns [T, H, P]."""
    del chunk_size
    rep = x.shape[1] // B.shape[1]
    A = -torch.exp(A_log.float())
    dt_all = F.softplus(dt.float() + dt_bias.float()).clamp(*dt_limit)  # [T, H]
    y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    bounds = cu_seqlens.tolist()
    for i, slot in enumerate(state_slots.tolist()):
        start, end = bounds[i], bounds[i + 1]
        state = ssm_states[slot].float() if bool(has_initial_state[i]) else ssm_states.new_zeros(
            ssm_states.shape[1:], dtype=torch.float32)
        for t in range(start, end):
            d = dt_all[t]  # [H]
            bt = B[t].float().repeat_interleave(rep, dim=0)  # [H, N]
            ct = C[t].float().repeat_interleave(rep, dim=0)
            xt = x[t].float()  # [H, P]
            state = state * torch.exp(d * A)[:, None, None] + (d[:, None] * xt)[..., None] * bt[:, None, :]
            y[t] = torch.einsum("hpn,hn->hp", state, ct) + D.float()[:, None] * xt
        ssm_states[slot] = state.to(ssm_states.dtype)
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(x.dtype)
