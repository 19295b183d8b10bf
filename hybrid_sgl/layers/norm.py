"""RMSNorm modules (weights as in the checkpoint), running the kernels of the DenseOps they are built
with (layers/backends.py)."""

import torch
from torch import nn

from hybrid_sgl.layers.backends import DenseOps


class RMSNorm(nn.Module):
    """x: [..., N] -> [..., N]. offset=1.0 for zero-centered weights (y = x/rms * (1 + w))."""

    def __init__(self, size: int, eps: float, offset: float = 0.0, *, ops: DenseOps):
        super().__init__()
        self.weight = nn.Parameter(torch.full((size,), 1.0 - offset))
        self.eps = eps
        self.offset = offset
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        return self.ops.rmsnorm(x=x.reshape(-1, shape[-1]), weight=self.weight, eps=self.eps,
                                offset=self.offset).view(shape)

    def add(self, x: torch.Tensor, residual: torch.Tensor, branch: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """x, residual (, branch): [T, N]. Returns (norm(r), r) in one pass, r = x + residual or
        (x + branch) + residual."""
        return self.ops.add_rmsnorm(x=x, residual=residual, weight=self.weight, eps=self.eps, offset=self.offset,
                                    branch=branch)


class GatedRMSNorm(nn.Module):
    """Per-head norm of the GDN output, gated by silu(z). x, z: [T, N] -> [T, N]."""

    def __init__(self, size: int, eps: float, *, ops: DenseOps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.ops = ops

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.ops.gated_rmsnorm(x=x, z=z, weight=self.weight, eps=self.eps)
