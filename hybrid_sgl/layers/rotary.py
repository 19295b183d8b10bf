"""Rotary position embedding, neox (rotate-half) style, on the first `rotary_dim` dims of each head."""

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    def __init__(self, *, head_dim: int, rotary_dim: int, base: float, max_positions: int):
        super().__init__()
        assert rotary_dim % 2 == 0 and rotary_dim <= head_dim
        self.rotary_dim = rotary_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
        freqs = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq[None, :]
        self.register_buffer("cos_sin", torch.cat([freqs.cos(), freqs.sin()], dim=-1), persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """positions: [T]; q: [T, Hq, D]; k: [T, Hkv, D]. Returns rotated (q, k)."""
        cos, sin = self.cos_sin[positions].float().unsqueeze(1).chunk(2, dim=-1)  # [T, 1, rot/2]
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        rot = x[..., : self.rotary_dim].float()
        x1, x2 = rot.chunk(2, dim=-1)
        rotated = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
        if self.rotary_dim == x.shape[-1]:
            return rotated
        return torch.cat([rotated, x[..., self.rotary_dim :]], dim=-1)
