"""Gated MLP: down(silu(gate x) * up x), with gate and up fused in one matmul.

Tensor parallel: gate and up rows split over the ranks (column-parallel), down_proj's columns
with them (row-parallel, one all-reduce)."""

import torch

from hybrid_sgl.distributed import current_tp
from hybrid_sgl.distributed.sharding import split_heads
from hybrid_sgl.layers.backends import DenseOps
from hybrid_sgl.layers.decoder_layer import FFN
from hybrid_sgl.layers.linear import Block, ColumnParallelLinear, RowParallelLinear


class GatedMLP(FFN):
    def __init__(self, hidden_size: int, intermediate_size: int, reduce: bool = True, *, ops: DenseOps):
        """reduce=False: under tensor parallelism return this rank's partial output (an MoE's shared expert,
        summed with the routed experts' in one all-reduce)."""
        super().__init__()
        split = split_heads(intermediate_size, current_tp().size, "intermediate_size")
        self.gate_up_proj = ColumnParallelLinear(hidden_size, [Block("gate_proj", 1, split),
                                                               Block("up_proj", 1, split)], ops=ops)
        self.down_proj = RowParallelLinear(Block("down_proj", 1, split), hidden_size, reduce=reduce, ops=ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""
        return self.down_proj(self.gate_up_proj.silu_and_mul(x))

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """Checkpoint names: gate_proj.weight, up_proj.weight, down_proj.weight."""
        if name in ("gate_proj.weight", "up_proj.weight"):
            self.gate_up_proj.load(name.removesuffix(".weight"), tensor)
        elif name == "down_proj.weight":
            self.down_proj.load(tensor)
        else:
            raise KeyError(name)
