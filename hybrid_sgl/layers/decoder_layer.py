"""The pre-norm hybrid block shared by most families: norm -> mixer -> add -> norm -> ffn.

Residual adds are fused into the next RMSNorm: a layer returns its FFN output as the delta for
the next layer (or the final norm) to add. An FFN with `add_norm_forward` (the sparse MoE) takes
the add and its pre-norm into its own first kernel. `residual_multiplier` scales both branch outputs
before they are added (Granite); `offset` = 1.0 for zero-centered norm weights (Qwen3-Next)."""

from dataclasses import dataclass

import torch
from torch import nn

from hybrid_sgl.batch import ForwardBatch
from hybrid_sgl.layers.norm import RMSNorm


@dataclass(frozen=True)
class LayerWeightNames:
    """A family's checkpoint names of the parts of a DecoderLayer (`layers.{i}.{part}.*`)."""

    mixer: tuple[str, ...]
    ffn: tuple[str, ...]
    input_norm: str = "input_layernorm"
    post_norm: tuple[str, ...] = ("post_attention_layernorm",)


class DecoderLayer(nn.Module):
    def __init__(self, mixer: nn.Module, ffn: nn.Module, hidden_size: int, eps: float, offset: float = 0.0,
                 residual_multiplier: float = 1.0):
        super().__init__()
        self.input_norm = RMSNorm(hidden_size, eps, offset)
        self.mixer = mixer
        self.post_norm = RMSNorm(hidden_size, eps, offset)
        self.ffn = ffn
        self.residual_multiplier = residual_multiplier

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, fb: ForwardBatch):
        """x: this layer's input delta [T, H]; residual: the stream before it (None at layer 0).
        Returns (scaled ffn output, residual stream)."""
        if residual is None:
            h, residual = self.input_norm(x), x
        else:
            h, residual = self.input_norm.add(x, residual)
        delta = self._scaled(self.mixer(h, fb))
        if hasattr(self.ffn, "add_norm_forward"):  # the FFN takes its pre-norm in its own first kernel
            out, residual = self.ffn.add_norm_forward(delta, residual, self.post_norm)
        else:
            h, residual = self.post_norm.add(delta, residual)
            out = self.ffn(h)
        return self._scaled(out), residual

    def _scaled(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.residual_multiplier if self.residual_multiplier != 1.0 else x

    def load_weight(self, part: str, rest: str, tensor: torch.Tensor, names: LayerWeightNames) -> None:
        if part in names.mixer:
            self.mixer.load_weight(rest, tensor)
        elif part in names.ffn:
            self.ffn.load_weight(rest, tensor)
        elif rest == "weight" and part == names.input_norm:
            self.input_norm.weight.data.copy_(tensor)
        elif rest == "weight" and part in names.post_norm:
            self.post_norm.weight.data.copy_(tensor)
        else:
            raise KeyError(f"{part}.{rest}")
