"""Gated DeltaNet gating shared by the decode and prefill ops (Qwen3-Next / Qwen3.5).

g    = -exp(A_log) * softplus(a + dt_bias)   (log of the per-step state decay, <= 0)
beta = sigmoid(b)                             (write strength of the delta rule)
"""

import torch
import torch.nn.functional as F


def gdn_gating_ref(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """a, b: [T, Hv]; A_log, dt_bias: [Hv]. Returns g, beta: [T, Hv] float32."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    beta = b.float().sigmoid()
    return g, beta


def l2norm_ref(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x * rsqrt(sum(x^2) + eps) over the last dim, in float32."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)
