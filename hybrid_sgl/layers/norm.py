"""RMSNorm modules (weights as in the checkpoint; math in triton_kernels.norms)."""

import torch
from torch import nn

from triton_kernels.norms import gated_rmsnorm_ref, rmsnorm_ref


class RMSNorm(nn.Module):
    """x: [..., N] -> [..., N]. offset=1.0 for zero-centered weights (y = x/rms * (1 + w))."""

    def __init__(self, size: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.full((size,), 1.0 - offset))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return rmsnorm_ref(x=x.reshape(-1, shape[-1]), weight=self.weight, eps=self.eps,
                           offset=self.offset).view(shape)


class GatedRMSNorm(nn.Module):
    """Per-head norm of the GDN output, gated by silu(z). x, z: [T, N] -> [T, N]."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return gated_rmsnorm_ref(x=x, z=z, weight=self.weight, eps=self.eps)
