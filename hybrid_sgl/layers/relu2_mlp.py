"""Non-gated MLP with a squared-ReLU activation (Nemotron-H): down(relu(up x) ** 2).

Tensor parallel: up rows split over the ranks (column-parallel), down_proj's columns with them
(row-parallel, one all-reduce)."""

import torch
from torch import nn

from hybrid_sgl.distributed import current_tp
from hybrid_sgl.distributed.sharding import split_heads
from hybrid_sgl.layers.backends import DenseOps
from hybrid_sgl.layers.linear import Block, ColumnParallelLinear, RowParallelLinear


class Relu2MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, *, ops: DenseOps):
        super().__init__()
        split = split_heads(intermediate_size, current_tp().size, "intermediate_size")
        self.up_proj = ColumnParallelLinear(hidden_size, [Block("up_proj", 1, split)], bias=bias, ops=ops)
        self.down_proj = RowParallelLinear(Block("down_proj", 1, split), hidden_size, bias=bias, ops=ops)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""
        return self.down_proj(self.ops.relu2(x=self.up_proj(x)))

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """Checkpoint names: up_proj.{weight,bias}, down_proj.{weight,bias}."""
        module, _, kind = name.partition(".")
        if module not in ("up_proj", "down_proj") or not isinstance(getattr(getattr(self, module), kind, None),
                                                                      nn.Parameter):
            raise KeyError(name)
        if module == "up_proj":
            self.up_proj.load("up_proj", tensor, kind)
        else:
            self.down_proj.load(tensor, kind)
