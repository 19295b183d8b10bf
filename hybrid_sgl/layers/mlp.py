"""Gated MLP: down(silu(gate x) * up x), with gate and up fused in one matmul."""

import torch
from torch import nn

from triton_kernels.norms import silu_and_mul, silu_and_mul_ref


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""
        gate_up = self.gate_up_proj(x)
        act = silu_and_mul(gate_up=gate_up) if x.is_cuda else silu_and_mul_ref(gate_up=gate_up)
        return self.down_proj(act)

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
