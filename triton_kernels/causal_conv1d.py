"""Depthwise causal conv1d over packed varlen tokens, with per-request conv state in a pool.

Conv state pool layout: `[num_slots, width - 1, dim]` (the last `width - 1` inputs of each
request, oldest first). Prefill reads the initial state of each sequence from its slot when
`has_initial_state`, and writes the final state back into the slot. Decode updates in place.
"""

import torch
import torch.nn.functional as F


def _activate(x: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return x
    if activation in ("silu", "swish"):
        return F.silu(x)
    raise ValueError(f"unsupported conv1d activation {activation!r}; expected 'silu' or None")


def causal_conv1d_prefill_ref(
    *,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
) -> torch.Tensor:
    """x: [T, D] packed; weight: [D, W]; conv_states: [S, W-1, D]; cu_seqlens: [B+1];
    state_slots, has_initial_state: [B]. Returns y: [T, D] in x's dtype."""
    width = weight.shape[1]
    w = weight.float().t()  # [W, D]
    y = torch.empty_like(x)
    bounds = cu_seqlens.tolist()
    for i, slot in enumerate(state_slots.tolist()):
        start, end = bounds[i], bounds[i + 1]
        if bool(has_initial_state[i]):
            init = conv_states[slot].float()
        else:
            init = x.new_zeros(width - 1, x.shape[1], dtype=torch.float32)
        full = torch.cat([init, x[start:end].float()])  # [W-1+L, D]
        windows = full.unfold(0, width, 1)  # [L, D, W]
        out = torch.einsum("ldw,wd->ld", windows, w)
        if bias is not None:
            out = out + bias.float()
        y[start:end] = _activate(out, activation).to(x.dtype)
        conv_states[slot] = full[full.shape[0] - (width - 1) :].to(conv_states.dtype)
    return y


def causal_conv1d_update_ref(
    *,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    state_slots: torch.Tensor,
    pad_slot: int = -1,
    activation: str | None = "silu",
) -> torch.Tensor:
    """One decode token per request. x: [B, D]; conv_states: [S, W-1, D] updated in place at
    state_slots [B]; rows whose slot is `pad_slot` are skipped (output zero)."""
    y = torch.zeros_like(x)
    keep = (state_slots != pad_slot).nonzero().flatten()
    if keep.numel() == 0:
        return y
    slots = state_slots[keep].long()
    full = torch.cat([conv_states[slots].float(), x[keep].float().unsqueeze(1)], dim=1)  # [b, W, D]
    out = torch.einsum("bwd,dw->bd", full, weight.float())
    if bias is not None:
        out = out + bias.float()
    y[keep] = _activate(out, activation).to(x.dtype)
    conv_states[slots] = full[:, 1:].to(conv_states.dtype)
    return y
