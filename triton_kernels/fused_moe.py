"""Mixture-of-experts feed-forward over routed tokens: out = sum_k w_k * down_e(silu(gate_e x) * up_e x)."""

import torch
import torch.nn.functional as F


def fused_moe_ref(
    *,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> torch.Tensor:
    """x: [T, H]; w13: [E, 2I, H] (gate rows then up rows); w2: [E, H, I];
    topk_weights: [T, k] float32; topk_ids: [T, k]. Returns [T, H] in x's dtype."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.flatten()
    for expert in flat_ids.unique().tolist():
        token, which = (topk_ids == expert).nonzero(as_tuple=True)
        gate, up = F.linear(x[token], w13[expert]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[expert])
        out.index_add_(0, token, y.float() * topk_weights[token, which, None])
    return out.to(x.dtype)
