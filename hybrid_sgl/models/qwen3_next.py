"""Qwen3-Next, Qwen3.5 and Qwen3.5-MoE text models: Gated DeltaNet and gated full attention
layers (by layer plan), dense MLP or sparse MoE, zero-centered RMSNorm. Config: hybrid_sgl/config/qwen3_next.py.
With config.mtp_layers > 0 the MTP draft layer is built too (models/mtp.py); otherwise `mtp.*` is skipped."""

from __future__ import annotations

import torch

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.layers.attention import GatedAttention
from hybrid_sgl.layers.decoder_layer import DecoderLayer, LayerWeightNames
from hybrid_sgl.layers.gdn import GatedDeltaNet
from hybrid_sgl.layers.mlp import GatedMLP
from hybrid_sgl.layers.moe import SparseMoE
from hybrid_sgl.layers.norm import RMSNorm
from hybrid_sgl.layers.rotary import RotaryEmbedding
from hybrid_sgl.models.base import Backends, HybridCausalLM
from hybrid_sgl.models.mtp import MTPHead

_NAMES = LayerWeightNames(mixer=("self_attn", "linear_attn"), ffn=("mlp",))
_SKIPPED = ("model.visual.", "visual.", "mtp.", "model.mtp.")


class Qwen3NextForCausalLM(HybridCausalLM):
    tensor_parallel = True
    skipped_prefixes = _SKIPPED

    def __init__(self, config: ModelConfig, backends: Backends, max_positions: int):
        c = config
        dense = backends.dense
        super().__init__(config, backends, RMSNorm(c.hidden_size, c.rms_norm_eps, c.norm_offset, ops=dense))
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
                ffn = GatedMLP(c.hidden_size, c.intermediate_size, ops=dense)
            self.layers.append(DecoderLayer(mixer, ffn, c.hidden_size, c.rms_norm_eps, c.norm_offset, ops=dense))
        if c.mtp_layers:
            self.mtp = MTPHead(c, backends, rotary, first_kv_index=kv_index)

    def load_layer_weight(self, layer: DecoderLayer, part: str, rest: str, tensor: torch.Tensor) -> None:
        layer.load_weight(part, rest, tensor, _NAMES)
