"""Bamba and Granite-4.0-H (GraniteMoeHybrid): Mamba2 and attention layers, each followed by an FFN.

Bamba: attention at `attn_layer_indices`, partial rope, gated MLP (`feed_forward`).
Granite-4.0-H: `layer_types` mamba/attention, rope or none (`position_embedding_type`), muP
multipliers (embedding, residual, attention softmax scale, logits divisor) and an FFN that is a
routed MoE plus an always-on shared MLP, or the shared MLP alone when `num_local_experts` is 0.
The Granite router takes softmax over the top-k logits, which equals softmax over all experts,
then top-k, then renormalization (`SparseMoE` with `norm_topk_prob`). Config: hybrid_sgl/config/bamba.py.
"""

from __future__ import annotations

import torch
from torch import nn

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.config.bamba import GRANITE
from hybrid_sgl.layers.attention import GatedAttention
from hybrid_sgl.layers.decoder_layer import DecoderLayer, LayerWeightNames
from hybrid_sgl.layers.mamba2 import Mamba2Mixer
from hybrid_sgl.layers.mlp import GatedMLP
from hybrid_sgl.layers.moe import SparseMoE
from hybrid_sgl.layers.norm import RMSNorm
from hybrid_sgl.layers.rotary import RotaryEmbedding
from hybrid_sgl.models.base import Backends, HybridCausalLM

# Bamba's gated MLP is feed_forward; Granite's FFN norm is post_attention_layernorm
_NAMES = LayerWeightNames(mixer=("mamba", "self_attn"), ffn=("feed_forward",),
                          post_norm=("pre_ff_layernorm", "post_attention_layernorm"))
# Granite FFN names (original checkpoints and transformers v5 saves) -> SparseMoE names
_GRANITE_MOE_NAMES = {
    "router.layer.weight": "gate.weight", "router.weight": "gate.weight",
    "input_linear.weight": "experts.gate_up_proj", "experts.gate_up_proj": "experts.gate_up_proj",
    "output_linear.weight": "experts.down_proj", "experts.down_proj": "experts.down_proj",
}
# Granite's residual_multiplier scales each branch's output before the residual add: folded into the tensors that
# end a branch as they load ((part, name): the mixers' output projections, the experts' and the shared MLP's output
# linears). Checkpoint FP8 tensors arrive dequantized and are quantized again after loading.
_ENDS_A_BRANCH = {("mamba", "out_proj.weight"), ("mamba", "out_proj.bias"), ("self_attn", "o_proj.weight"),
                  ("self_attn", "o_proj.bias"), ("shared_mlp", "output_linear.weight"),
                  ("block_sparse_moe", "output_linear.weight"), ("block_sparse_moe", "experts.down_proj")}


class BambaForCausalLM(HybridCausalLM):
    """Serves BambaForCausalLM and GraniteMoeHybridForCausalLM checkpoints."""

    tensor_parallel = True
    final_norm_names = ("norm.weight", "final_layernorm.weight")

    def __init__(self, config: ModelConfig, backends: Backends, max_positions: int):
        c, hf = config, config.hf_text_config
        dense = backends.dense
        super().__init__(config, backends, RMSNorm(c.hidden_size, c.rms_norm_eps, ops=dense))
        granite = c.model_type == GRANITE
        if granite:
            self.embedding_scale = float(hf.get("embedding_multiplier", 1.0))
            self.logits_scale = 1.0 / float(hf.get("logits_scaling", 1.0))
        self.residual_multiplier = float(hf.get("residual_multiplier", 1.0)) if granite else 1.0
        a = c.attention
        rotary = None
        if a.rotary_dim:
            rotary = RotaryEmbedding(head_dim=a.head_dim, rotary_dim=a.rotary_dim, base=a.rope_theta,
                                     max_positions=max_positions)
        kv_index, state_index = 0, 0
        for mixer_kind, ffn_kind in c.layer_plan:
            if mixer_kind == "full_attention":
                mixer = GatedAttention(spec=a, hidden_size=c.hidden_size, eps=c.rms_norm_eps, norm_offset=0.0,
                                       kv_index=kv_index, rotary=rotary, ops=backends.attention)
                kv_index += 1
            else:
                mixer = Mamba2Mixer(spec=c.mamba2, hidden_size=c.hidden_size, eps=c.rms_norm_eps,
                                    state_index=state_index, ops=backends.ssm)
                state_index += 1
            if ffn_kind == "moe":
                ffn = SparseMoE(spec=c.moe, hidden_size=c.hidden_size, ops=backends.moe)
            else:
                ffn = GatedMLP(c.hidden_size, c.intermediate_size, ops=dense)
            self.layers.append(DecoderLayer(mixer, ffn, c.hidden_size, c.rms_norm_eps, ops=dense))


    def load_layer_weight(self, layer: DecoderLayer, part: str, rest: str, tensor: torch.Tensor) -> None:
        if self.residual_multiplier != 1.0 and (part, rest) in _ENDS_A_BRANCH:
            tensor = (tensor.float() * self.residual_multiplier).to(tensor.dtype)
        if part == "block_sparse_moe" and rest in _GRANITE_MOE_NAMES and isinstance(layer.ffn, SparseMoE):
            layer.ffn.load_weight(_GRANITE_MOE_NAMES[rest], tensor)
        elif part == "shared_mlp":
            self._load_shared_mlp(layer.ffn, rest, tensor)
        else:
            layer.load_weight(part, rest, tensor, _NAMES)

    @staticmethod
    def _load_shared_mlp(ffn: nn.Module, rest: str, tensor: torch.Tensor) -> None:
        """Granite's shared MLP: input_linear [2I, H] = [gate rows | up rows], output_linear [H, I];
        the whole FFN (dense) or the shared expert beside the routed experts (MoE)."""
        prefix = "shared_expert." if isinstance(ffn, SparseMoE) else ""
        if rest == "input_linear.weight":
            gate, up = tensor.chunk(2, dim=0)
            ffn.load_weight(prefix + "gate_proj.weight", gate)
            ffn.load_weight(prefix + "up_proj.weight", up)
        elif rest == "output_linear.weight":
            ffn.load_weight(prefix + "down_proj.weight", tensor)
        else:
            raise KeyError(rest)
