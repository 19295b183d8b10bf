"""Gated MLP: down(silu(gate x) * up x), with gate and up fused in one matmul."""

import torch
from torch import nn

from hybrid_sgl.layers.linear import Linear


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""
        return self.down_proj(self.gate_up_proj(x), act="silu_mul")

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """Checkpoint names: gate_proj.weight, up_proj.weight, down_proj.weight."""
        n = self.intermediate_size
        if name == "gate_proj.weight":
            self.gate_up_proj.weight.data[:n].copy_(tensor)
        elif name == "up_proj.weight":
            self.gate_up_proj.weight.data[n:].copy_(tensor)
        elif name == "down_proj.weight":
            self.down_proj.weight.data.copy_(tensor)
        else:
            raise KeyError(name)
