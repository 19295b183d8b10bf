"""Linear layer whose decode-size calls go through the skinny matmul.

`Linear` is nn.Linear plus an optional activation of its input (act="silu_mul": x = [gate | up]
of a gated MLP; act="relu2"). Inputs of at most `skinny_rows` rows (a decode batch) run through
triton_kernels/skinny_matmul.py, which streams the weight once with the activation fused into the
read; larger inputs (prefill) and layers with a bias run the activation kernel, then F.linear.
`skinny_rows` is 0 (off) until `use_skinny_matmul` sets it on a built model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from triton_kernels.norms import silu_and_mul, silu_and_mul_ref
from triton_kernels.skinny_matmul import MAX_M, skinny_matmul

# The batch sizes where the skinny matmul beat cuBLAS on the H200 at every linear shape of
# Qwen3.5-9B and Nemotron-H-8B (bench/skinny_matmul_bench.py, bench/README.md).
SKINNY_MAX_ROWS = 32


def apply_act(x: torch.Tensor, act: str) -> torch.Tensor:
    """The eager activation: silu_mul on [T, 2I] -> [T, I]; relu2; none."""
    if act == "silu_mul":
        return silu_and_mul(gate_up=x) if x.is_cuda else silu_and_mul_ref(gate_up=x)
    if act == "relu2":
        return F.relu(x).square()
    return x


class Linear(nn.Linear):
    skinny_rows: int = 0

    def forward(self, x: torch.Tensor, act: str = "none") -> torch.Tensor:
        """x: [T, in] ([T, 2 * in] with act="silu_mul") -> [T, out]."""
        if x.shape[0] <= self.skinny_rows and self.bias is None and x.dim() == 2:
            return skinny_matmul(x=x, weight=self.weight, act=act)
        return F.linear(apply_act(x, act), self.weight, self.bias)


def use_skinny_matmul(model: nn.Module, max_rows: int) -> int:
    """Routes inputs of ≤ max_rows rows of every `Linear` in model to the skinny matmul (0: none).
    Returns how many layers take it."""
    assert 0 <= max_rows <= MAX_M, f"skinny matmul rows must be in [0, {MAX_M}], got {max_rows}"
    layers = [m for m in model.modules() if isinstance(m, Linear) and m.bias is None]
    for m in layers:
        m.skinny_rows = max_rows
    return len(layers) if max_rows else 0
