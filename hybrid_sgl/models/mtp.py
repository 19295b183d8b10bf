"""The multi-token-prediction (MTP) layer of Qwen3-Next and Qwen3.5 (`mtp.*` in their checkpoints),
the draft model of speculative decoding (--speculative-algorithm NEXTN).

Entry i of a sequence takes the token at position i + 1 and the target model's final hidden
state at position i (after its final norm) and predicts the token at position i + 2:

    e = pre_fc_norm_embedding(embed(token))          [T, H]  (the model's own embedding)
    h = pre_fc_norm_hidden(hidden)                   [T, H]
    x = fc(cat(e, h))                                [T, 2H] -> [T, H]
    x = layers(x)                                    gated full attention + MLP (or MoE)
    out = norm(x)                                    [T, H]; logits = the model's lm_head(out)

Its attention keeps its own KV in the KV pool, as the layer after the target's KV layers, at the
positions i of its entries. Chained drafts feed `out` back as the next entry's hidden."""

from __future__ import annotations

import re

import torch
from torch import nn

from hybrid_sgl.batch import ForwardBatch
from hybrid_sgl.config import ModelConfig
from hybrid_sgl.layers.attention import GatedAttention
from hybrid_sgl.layers.backends import Backends
from hybrid_sgl.layers.decoder_layer import DecoderLayer, LayerWeightNames
from hybrid_sgl.layers.mlp import GatedMLP
from hybrid_sgl.layers.moe import SparseMoE
from hybrid_sgl.layers.norm import RMSNorm
from hybrid_sgl.layers.quantization import QuantizableLinear
from hybrid_sgl.layers.rotary import RotaryEmbedding

_NAMES = LayerWeightNames(mixer=("self_attn",), ffn=("mlp",))
_LAYER = re.compile(r"layers\.(\d+)\.(\w+)\.(.+)")


class MTPHead(nn.Module):
    def __init__(self, config: ModelConfig, backends: Backends, rotary: RotaryEmbedding, first_kv_index: int):
        """first_kv_index: the KV-pool layer of the first MTP layer (the target's KV layers come first)."""
        super().__init__()
        c, dense = config, backends.dense
        hidden = c.hidden_size
        self.pre_fc_norm_embedding = RMSNorm(hidden, c.rms_norm_eps, c.norm_offset, ops=dense)
        self.pre_fc_norm_hidden = RMSNorm(hidden, c.rms_norm_eps, c.norm_offset, ops=dense)
        self.fc = QuantizableLinear(2 * hidden, hidden, bias=False, ops=dense)
        self.layers = nn.ModuleList()
        for i in range(c.mtp_layers):
            mixer = GatedAttention(spec=c.attention, hidden_size=hidden, eps=c.rms_norm_eps, norm_offset=c.norm_offset,
                                   kv_index=first_kv_index + i, rotary=rotary, ops=backends.attention)
            ffn = (SparseMoE(spec=c.moe, hidden_size=hidden, ops=backends.moe) if c.moe is not None
                   else GatedMLP(hidden, c.intermediate_size, ops=dense))
            self.layers.append(DecoderLayer(mixer, ffn, hidden, c.rms_norm_eps, c.norm_offset, ops=dense))
        self.norm = RMSNorm(hidden, c.rms_norm_eps, c.norm_offset, ops=dense)

    def forward(self, embedded: torch.Tensor, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """embedded: the entries' tokens through the model's embedding [T, H]; hidden: the previous
        position's final hidden state [T, H]; fb: the entries' batch (positions i). Returns [T, H]."""
        x = self.fc(torch.cat([self.pre_fc_norm_embedding(embedded), self.pre_fc_norm_hidden(hidden)], dim=-1))
        residual = None
        for layer in self.layers:
            x, residual = layer(x, residual, fb)
        return self.norm.add(x, residual)[0]

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """name relative to `mtp.`."""
        if m := _LAYER.fullmatch(name):
            self.layers[int(m.group(1))].load_weight(m.group(2), m.group(3), tensor, _NAMES)
        elif name in ("pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight"):
            getattr(self, name.partition(".")[0]).weight.data.copy_(tensor)
        elif name == "fc.weight":
            self.fc.weight.data.copy_(tensor)
        else:
            raise KeyError(f"mtp.{name}")
