"""Bamba and Granite-4.0-H (GraniteMoeHybrid): Mamba2 and attention layers, each followed by an FFN.

Bamba: attention at `attn_layer_indices`, partial rope, gated MLP (`feed_forward`).
Granite-4.0-H: `layer_types` mamba/attention, rope or none (`position_embedding_type`), muP
multipliers (embedding, residual, attention softmax scale, logits divisor) and an FFN that is a
routed MoE plus an always-on shared MLP, or the shared MLP alone when `num_local_experts` is 0.
The Granite router takes softmax over the top-k logits, which equals softmax over all experts,
then top-k, then renormalization (`SparseMoE` with `norm_topk_prob`).
"""

from __future__ import annotations

import torch
from torch import nn

from hybrid_sgl.config import (
    AttentionSpec,
    Mamba2Spec,
    ModelConfig,
    MoESpec,
    checkpoint_fields,
    dt_limit,
    rope_params,
)
from hybrid_sgl.layers.attention import GatedAttention
from hybrid_sgl.layers.decoder_layer import DecoderLayer, LayerWeightNames
from hybrid_sgl.layers.mamba2 import Mamba2Mixer
from hybrid_sgl.layers.mlp import GatedMLP
from hybrid_sgl.layers.moe import SparseMoE
from hybrid_sgl.layers.norm import RMSNorm
from hybrid_sgl.layers.rotary import RotaryEmbedding
from hybrid_sgl.models.base import Backends, HybridCausalLM

GRANITE = "granitemoehybrid"
_MIXER_OF_LAYER_TYPE = {"mamba": "mamba2", "linear_attention": "mamba2",
                        "attention": "full_attention", "full_attention": "full_attention"}


# ---- config ------------------------------------------------------------------------------------
def parse_config(hf: dict, gen_eos: list[int]) -> ModelConfig:
    """Bamba (`model_type` bamba) and Granite-4.0-H (granitemoehybrid) -> ModelConfig."""
    granite = hf["model_type"] == GRANITE
    _check_supported(hf, granite)
    n_layers = hf["num_hidden_layers"]
    mixers = _granite_mixers(hf, n_layers) if granite else _bamba_mixers(hf, n_layers)
    moe = _granite_moe(hf) if granite else None
    ffn = "moe" if moe is not None else "mlp"
    heads = hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
    if granite:  # HF's Granite rotary covers the whole head; Bamba's defaults to half of it
        rotary_dim = head_dim if hf.get("position_embedding_type") == "rope" else 0
        theta = rope_params(hf)[0] if rotary_dim else 10000.0
    else:
        theta, partial = rope_params({"partial_rotary_factor": 0.5, **hf})
        rotary_dim = int(head_dim * partial)
    return ModelConfig(
        **checkpoint_fields(hf, gen_eos, "BambaForCausalLM"),
        hidden_size=hf["hidden_size"],
        intermediate_size=hf.get("shared_intermediate_size", 1024) if granite else hf["intermediate_size"],
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6 if granite else 1e-5),
        norm_offset=0.0,
        hidden_act=hf.get("hidden_act", "silu"),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        context_length=hf.get("max_position_embeddings", 2048 if granite else 262144),
        layer_plan=tuple((mixer, ffn) for mixer in mixers),
        attention=AttentionSpec(
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rotary_dim=rotary_dim,
            rope_theta=theta,
            output_gate=False,
            qk_norm=False,
            bias=bool(hf.get("attention_bias", False)),
            scale=float(hf.get("attention_multiplier", 1.0)) if granite else None,
        ),
        mamba2=_mamba2_spec(hf),
        moe=moe,
        hf_text_config=hf,
    )


def _check_supported(hf: dict, granite: bool) -> None:
    act = hf.get("hidden_act", "silu")
    if act not in ("silu", "swish"):
        raise ValueError(f"hidden_act {act!r} is not supported for {hf['model_type']} (supported: silu)")
    if not granite and hf.get("mlp_bias", False):
        raise ValueError("Bamba with mlp_bias=true is not supported (the gated MLP has no biases)")
    if granite and hf.get("position_embedding_type") not in (None, "nope", "rope"):
        raise ValueError(f"position_embedding_type {hf['position_embedding_type']!r} is not supported "
                         "(supported: rope, nope or null)")


def _bamba_mixers(hf: dict, n_layers: int) -> list[str]:
    attn = set(hf.get("attn_layer_indices") or [])
    if bad := sorted(i for i in attn if not 0 <= i < n_layers):
        raise ValueError(f"attn_layer_indices {bad} are outside the {n_layers} layers")
    return ["full_attention" if i in attn else "mamba2" for i in range(n_layers)]


def _granite_mixers(hf: dict, n_layers: int) -> list[str]:
    types = hf.get("layer_types") or ["mamba"] * n_layers
    if len(types) != n_layers:
        raise ValueError(f"layer_types has {len(types)} entries for num_hidden_layers={n_layers}")
    if unknown := sorted({t for t in types if t not in _MIXER_OF_LAYER_TYPE}):
        raise ValueError(f"unknown layer_types {unknown}; expected mamba or attention")
    return [_MIXER_OF_LAYER_TYPE[t] for t in types]


def _granite_moe(hf: dict) -> MoESpec | None:
    experts = hf.get("num_local_experts", 8) or 0
    if experts == 0:
        return None
    return MoESpec(num_experts=experts, top_k=hf.get("num_experts_per_tok", 2),
                   intermediate_size=hf["intermediate_size"], norm_topk_prob=True,
                   shared_expert_intermediate_size=hf.get("shared_intermediate_size", 1024),
                   shared_expert_gate=False)


def _mamba2_spec(hf: dict) -> Mamba2Spec:
    hidden, heads = hf["hidden_size"], hf.get("mamba_n_heads", 128)
    inner = hf.get("mamba_expand", 2) * hidden
    head_dim = hf.get("mamba_d_head", "auto")
    head_dim = inner // heads if head_dim in (None, "auto") else int(head_dim)
    if heads * head_dim != inner:
        raise ValueError(f"mamba_n_heads={heads} x mamba_d_head={head_dim} != mamba_expand x hidden_size = {inner}")
    return Mamba2Spec(
        num_heads=heads,
        head_dim=head_dim,
        state_size=hf.get("mamba_d_state", 256),
        n_groups=hf.get("mamba_n_groups", 1),
        conv_kernel=hf.get("mamba_d_conv", 4),
        chunk_size=hf.get("mamba_chunk_size", 256),
        conv_bias=bool(hf.get("mamba_conv_bias", True)),
        proj_bias=bool(hf.get("mamba_proj_bias", False)),
        dt_limit=dt_limit(hf),
    )




# ---- model -------------------------------------------------------------------------------------
# Bamba's gated MLP is feed_forward; Granite's FFN norm is post_attention_layernorm
_NAMES = LayerWeightNames(mixer=("mamba", "self_attn"), ffn=("feed_forward",),
                          post_norm=("pre_ff_layernorm", "post_attention_layernorm"))
# Granite FFN names (original checkpoints and transformers v5 saves) -> SparseMoE names
_GRANITE_MOE_NAMES = {
    "router.layer.weight": "gate.weight", "router.weight": "gate.weight",
    "input_linear.weight": "experts.gate_up_proj", "experts.gate_up_proj": "experts.gate_up_proj",
    "output_linear.weight": "experts.down_proj", "experts.down_proj": "experts.down_proj",
}


class BambaForCausalLM(HybridCausalLM):
    """Serves BambaForCausalLM and GraniteMoeHybridForCausalLM checkpoints."""

    tensor_parallel = True
    final_norm_names = ("norm.weight", "final_layernorm.weight")

    def __init__(self, config: ModelConfig, backends: Backends, max_positions: int):
        c, hf = config, config.hf_text_config
        super().__init__(config, backends, RMSNorm(c.hidden_size, c.rms_norm_eps))
        granite = c.model_type == GRANITE
        if granite:
            self.embedding_scale = float(hf.get("embedding_multiplier", 1.0))
            self.logits_scale = 1.0 / float(hf.get("logits_scaling", 1.0))
        residual_multiplier = float(hf.get("residual_multiplier", 1.0)) if granite else 1.0
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
                ffn = GatedMLP(c.hidden_size, c.intermediate_size)
            self.layers.append(DecoderLayer(mixer, ffn, c.hidden_size, c.rms_norm_eps,
                                            residual_multiplier=residual_multiplier))


    def load_layer_weight(self, layer: DecoderLayer, part: str, rest: str, tensor: torch.Tensor) -> None:
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
