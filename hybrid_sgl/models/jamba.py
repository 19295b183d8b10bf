"""Jamba: Mamba-1 (selective scan) and full attention layers without position encoding, each
followed by a dense gated MLP or a sparse MoE (softmax over all experts, top-k weights left
unnormalized, no shared expert). Which layer is what comes from attn_layer_period/offset and
expert_layer_period/offset (config: hybrid_sgl/config/jamba.py)."""

from __future__ import annotations

import torch

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.layers.attention import GatedAttention
from hybrid_sgl.layers.decoder_layer import DecoderLayer, LayerWeightNames
from hybrid_sgl.layers.mamba import MambaMixer
from hybrid_sgl.layers.mlp import GatedMLP
from hybrid_sgl.layers.moe import SparseMoE
from hybrid_sgl.layers.norm import RMSNorm
from hybrid_sgl.models.base import Backends, HybridCausalLM

_NAMES = LayerWeightNames(mixer=("self_attn", "mamba"), ffn=("feed_forward",), post_norm=("pre_ff_layernorm",))


class JambaForCausalLM(HybridCausalLM):
    tensor_parallel = True
    final_norm_names = ("final_layernorm.weight",)

    def __init__(self, config: ModelConfig, backends: Backends, max_positions: int):
        c = config
        dense = backends.dense
        super().__init__(config, backends, RMSNorm(c.hidden_size, c.rms_norm_eps, ops=dense))
        kv_index, state_index = 0, 0
        for mixer_kind, ffn_kind in c.layer_plan:
            if mixer_kind == "full_attention":
                mixer = GatedAttention(spec=c.attention, hidden_size=c.hidden_size, eps=c.rms_norm_eps,
                                       norm_offset=0.0, kv_index=kv_index, rotary=None, ops=backends.attention)
                kv_index += 1
            else:
                mixer = MambaMixer(spec=c.mamba, hidden_size=c.hidden_size, eps=c.rms_norm_eps,
                                   state_index=state_index, ops=backends.ssm)
                state_index += 1
            if ffn_kind == "moe":
                ffn = SparseMoE(spec=c.moe, hidden_size=c.hidden_size, ops=backends.moe)
            else:
                ffn = GatedMLP(c.hidden_size, c.intermediate_size, ops=dense)
            self.layers.append(DecoderLayer(mixer, ffn, c.hidden_size, c.rms_norm_eps, ops=dense))


    def load_layer_weight(self, layer: DecoderLayer, part: str, rest: str, tensor: torch.Tensor) -> None:
        """Parts: self_attn | mamba | feed_forward (its MoE router is feed_forward.router) |
        input_layernorm | pre_ff_layernorm."""
        if part == "feed_forward" and rest == "router.weight":
            rest = "gate.weight"
        layer.load_weight(part, rest, tensor, _NAMES)
