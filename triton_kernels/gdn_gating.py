"""Gated DeltaNet gating shared by the decode and prefill ops (Qwen3-Next / Qwen3.5).

g    = -exp(A_log) * softplus(a + dt_bias)   (log of the per-step state decay, <= 0)
beta = sigmoid(b)                             (write strength of the delta rule)
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def gdn_gate(b_a, b_b, b_A_log, b_dt_bias):
    """Triton twin of gdn_gating_ref on loaded blocks (A_log, dt_bias already float32):
    returns (g, beta) in float32."""
    b_x = b_a.to(tl.float32) + b_dt_bias
    b_softplus = tl.where(b_x <= 20.0, tl.log(1.0 + tl.exp(b_x)), b_x)  # torch's threshold
    return -tl.exp(b_A_log) * b_softplus, tl.sigmoid(b_b.to(tl.float32))


@triton.jit
def l2norm(b_x, AXIS: tl.constexpr):
    """Triton twin of l2norm_ref (eps 1e-6) along AXIS, in float32."""
    b_x = b_x.to(tl.float32)
    return b_x * tl.rsqrt(tl.sum(b_x * b_x, axis=AXIS, keep_dims=True) + 1e-6)


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
