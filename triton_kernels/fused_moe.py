"""Mixture-of-experts feed-forward over routed tokens: out[t] = sum_k w[t, k] * y_{e(t, k)}(x[t]).

activation "silu": gated experts, y_e(x) = down_e(silu(gate_e x) * up_e x), w13 [E, 2I, H];
activation "relu2": non-gated experts (Nemotron-H), y_e(x) = down_e(relu(up_e x)^2), w13 [E, I, H]."""

import torch
import torch.nn.functional as F


def fused_moe_ref(
    *,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
) -> torch.Tensor:
    """x: [T, H]; w13: [E, 2I, H] (gate rows then up rows) or [E, I, H] for relu2; w2: [E, H, I];
    topk_weights: [T, k] float32; topk_ids: [T, k]. Returns [T, H] in x's dtype."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.flatten()
    for expert in flat_ids.unique().tolist():
        token, which = (topk_ids == expert).nonzero(as_tuple=True)
        h = F.linear(x[token], w13[expert])
        if activation == "silu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        elif activation == "relu2":
            h = F.relu(h).square()
        else:
            raise ValueError(f"unsupported MoE activation {activation!r}; expected 'silu' or 'relu2'")
        y = F.linear(h, w2[expert])
        out.index_add_(0, token, y.float() * topk_weights[token, which, None])
    return out.to(x.dtype)
