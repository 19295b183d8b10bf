"""Non-gated MLP with a squared-ReLU activation (Nemotron-H): down(relu(up x) ** 2)."""

import torch
from torch import nn

from triton_kernels.norms import relu2, relu2_ref


class Relu2MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False):
        super().__init__()
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""
        up = self.up_proj(x)
        return self.down_proj(relu2(x=up) if up.is_cuda else relu2_ref(x=up))

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """Checkpoint names: up_proj.{weight,bias}, down_proj.{weight,bias}."""
        module, _, kind = name.partition(".")
        param = getattr(getattr(self, module), kind, None) if module in ("up_proj", "down_proj") else None
        if not isinstance(param, nn.Parameter):
            raise KeyError(name)
        param.data.copy_(tensor)
