"""Qwen3-Next, Qwen3.5 and Qwen3.5-MoE text models: Gated DeltaNet and gated full attention
layers (by layer plan), dense MLP or sparse MoE, zero-centered RMSNorm."""

from __future__ import annotations

import re

import torch

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.layers.attention import GatedAttention
from hybrid_sgl.layers.decoder_layer import DecoderLayer
from hybrid_sgl.layers.gdn import GatedDeltaNet
from hybrid_sgl.layers.mlp import GatedMLP
from hybrid_sgl.layers.moe import SparseMoE
from hybrid_sgl.layers.norm import RMSNorm
from hybrid_sgl.layers.rotary import RotaryEmbedding
from hybrid_sgl.models.base import Backends, HybridCausalLM

_LAYER = re.compile(r"layers\.(\d+)\.(\w+)\.(.+)")
_SKIPPED = ("model.visual.", "visual.", "mtp.", "model.mtp.")


class Qwen3NextForCausalLM(HybridCausalLM):
    skipped_prefixes = _SKIPPED

    def __init__(self, config: ModelConfig, backends: Backends, max_positions: int):
        c = config
        super().__init__(config, backends, RMSNorm(c.hidden_size, c.rms_norm_eps, c.norm_offset))
        rotary = RotaryEmbedding(head_dim=c.attention.head_dim, rotary_dim=c.attention.rotary_dim,
                                 base=c.attention.rope_theta, max_positions=max_positions)
        kv_index, state_index = 0, 0
        for mixer_kind, ffn_kind in c.layer_plan:
            if mixer_kind == "full_attention":
                mixer = GatedAttention(spec=c.attention, hidden_size=c.hidden_size, eps=c.rms_norm_eps,
                                       norm_offset=c.norm_offset, kv_index=kv_index, rotary=rotary,
                                       ops=backends.attention)
                kv_index += 1
            else:
                mixer = GatedDeltaNet(spec=c.gdn, hidden_size=c.hidden_size, eps=c.rms_norm_eps,
                                      state_index=state_index, ops=backends.linear_attention)
                state_index += 1
            if ffn_kind == "moe":
                ffn = SparseMoE(spec=c.moe, hidden_size=c.hidden_size, ops=backends.moe)
            else:
                ffn = GatedMLP(c.hidden_size, c.intermediate_size)
            self.layers.append(DecoderLayer(mixer, ffn, c.hidden_size, c.rms_norm_eps, c.norm_offset))

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        if name == "embed_tokens.weight":
            self.embed.weight.data.copy_(tensor)
        elif name == "norm.weight":
            self.norm.weight.data.copy_(tensor)
        elif m := _LAYER.fullmatch(name):
            layer = self.layers[int(m.group(1))]
            part, rest = m.group(2), m.group(3)
            if part in ("self_attn", "linear_attn"):
                layer.mixer.load_weight(rest, tensor)
            elif part == "mlp":
                layer.ffn.load_weight(rest, tensor)
            elif part == "input_layernorm" and rest == "weight":
                layer.input_norm.weight.data.copy_(tensor)
            elif part == "post_attention_layernorm" and rest == "weight":
                layer.post_norm.weight.data.copy_(tensor)
            else:
                raise KeyError(name)
        else:
            raise KeyError(name)
