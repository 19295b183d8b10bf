"""The rotary position table: cos | sin of each position for the first `rotary_dim` dims of a head (neox,
rotate-half). Attention layers rotate q and k with their DenseOps (rope, or qk_norm_rope after q/k norms)."""

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    def __init__(self, *, head_dim: int, rotary_dim: int, base: float, max_positions: int):
        super().__init__()
        assert rotary_dim % 2 == 0 and rotary_dim <= head_dim
        self.rotary_dim = rotary_dim
        inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))
        freqs = torch.arange(max_positions, dtype=torch.float)[:, None] * inv_freq[None, :]
        self.register_buffer("cos_sin", torch.cat([freqs.cos(), freqs.sin()], dim=-1), persistent=False)  # [P, rot]
