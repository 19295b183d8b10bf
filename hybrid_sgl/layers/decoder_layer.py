"""The pre-norm hybrid block shared by most families: norm -> mixer -> add -> norm -> ffn.

Residual adds are fused into the next RMSNorm: a layer returns its FFN output as the delta for
the next layer (or the final norm) to add. The FFN takes the add and its pre-norm through
`FFN.add_norm_forward`, which the sparse MoE overrides to run them in its router's first kernel.
`offset` = 1.0 for zero-centered norm weights (Qwen3-Next); Granite's residual multiplier is folded into the
weights that end each branch as they load (models/bamba.py). A composed hybrid's layer may lack its mixer or its
FFN (None: that half and its norm are absent)."""

from dataclasses import dataclass

import torch
from torch import nn

from hybrid_sgl.batch import ForwardBatch
from hybrid_sgl.layers.backends import DenseOps
from hybrid_sgl.layers.norm import RMSNorm


@dataclass(frozen=True)
class LayerWeightNames:
    """A family's checkpoint names of the parts of a DecoderLayer (`layers.{i}.{part}.*`)."""

    mixer: tuple[str, ...]
    ffn: tuple[str, ...]
    input_norm: str = "input_layernorm"
    post_norm: tuple[str, ...] = ("post_attention_layernorm",)


class FFN(nn.Module):
    """The FFN half of a DecoderLayer: forward(h) on the normed stream, [T, H] -> [T, H]."""

    def add_norm_forward(self, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """x (the mixer's delta), residual: [T, H] -> (forward(norm(x + residual)), x + residual)."""
        h, residual = norm.add(x, residual)
        return self(h), residual


class DecoderLayer(nn.Module):
    def __init__(self, mixer: nn.Module | None, ffn: FFN | None, hidden_size: int, eps: float, offset: float = 0.0,
                 *, ops: DenseOps):
        """ops: the layer norms' kernels (Backends.dense)."""
        super().__init__()
        self.input_norm = RMSNorm(hidden_size, eps, offset, ops=ops) if mixer is not None else None
        self.mixer = mixer
        self.post_norm = RMSNorm(hidden_size, eps, offset, ops=ops) if ffn is not None else None
        self.ffn = ffn

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, fb: ForwardBatch):
        """x: this layer's input delta [T, H]; residual: the stream before it (None at layer 0).
        Returns (this layer's output delta, residual stream)."""
        if self.mixer is not None:
            h, residual = (self.input_norm(x), x) if residual is None else self.input_norm.add(x, residual)
            x = self.mixer(h, fb)
        if self.ffn is not None:
            if residual is None:  # a first layer without a mixer
                x, residual = self.ffn(self.post_norm(x)), x
            else:
                x, residual = self.ffn.add_norm_forward(x, residual, self.post_norm)
        return x, residual

    def load_weight(self, part: str, rest: str, tensor: torch.Tensor, names: LayerWeightNames) -> None:
        if part in names.mixer and self.mixer is not None:
            self.mixer.load_weight(rest, tensor)
        elif part in names.ffn and self.ffn is not None:
            self.ffn.load_weight(rest, tensor)
        elif rest == "weight" and part == names.input_norm and self.input_norm is not None:
            self.input_norm.weight.data.copy_(tensor)
        elif rest == "weight" and part in names.post_norm and self.post_norm is not None:
            self.post_norm.weight.data.copy_(tensor)
        else:
            raise KeyError(f"{part}.{rest}")
