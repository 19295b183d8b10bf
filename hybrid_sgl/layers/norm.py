"""RMSNorm modules (weights as in the checkpoint). On CUDA the fused Triton kernels run; on CPU
the torch references (triton_kernels.norms)."""

import torch
from torch import nn

from triton_kernels import norms


class RMSNorm(nn.Module):
    """x: [..., N] -> [..., N]. offset=1.0 for zero-centered weights (y = x/rms * (1 + w))."""

    def __init__(self, size: int, eps: float, offset: float = 0.0):
        super().__init__()
        self.weight = nn.Parameter(torch.full((size,), 1.0 - offset))
        self.eps = eps
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        fn = norms.rmsnorm if x.is_cuda else norms.rmsnorm_ref
        return fn(x=x.reshape(-1, shape[-1]), weight=self.weight, eps=self.eps, offset=self.offset).view(shape)

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x, residual: [T, N]. Returns (norm(x + residual), x + residual) in one pass."""
        fn = norms.add_rmsnorm if x.is_cuda else norms.add_rmsnorm_ref
        return fn(x=x, residual=residual, weight=self.weight, eps=self.eps, offset=self.offset)


class GatedRMSNorm(nn.Module):
    """Per-head norm of the GDN output, gated by silu(z). x, z: [T, N] -> [T, N]."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        fn = norms.gated_rmsnorm if x.is_cuda else norms.gated_rmsnorm_ref
        return fn(x=x, z=z, weight=self.weight, eps=self.eps)
