"""RMS norms used by the hybrid families.

rmsnorm:        y = x / rms(x) * w           (offset=0, e.g. Llama, Mamba2 hybrids)
                y = x / rms(x) * (1 + w)     (offset=1, zero-centered: Qwen3-Next / Qwen3.5)
gated_rmsnorm:  y = (x / rms(x)) * w * silu(z)   (norm before gate; GDN output norm)
"""

import torch
import torch.nn.functional as F


def rmsnorm_ref(*, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    """x: [T, N]; weight: [N]. Math in float32, result in x's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (weight.float() + offset)).to(x.dtype)


def gated_rmsnorm_ref(*, x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x, z: [T, N]; weight: [N]. Normalize x, scale by weight, gate by silu(z)."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * y * F.silu(z.float())).to(x.dtype)
