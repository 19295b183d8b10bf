"""Nemotron-H (and Nemotron-3 MoE): one block per layer, each block RMSNorm -> one of {Mamba2,
attention without rope, relu2 MLP, sigmoid-routed relu2 MoE} -> residual. The block kinds come
from `hybrid_override_pattern` (M, *, -, E) or its list form `layers_block_type`. Weights live under
`backbone.` (transformers' own renaming, `model.`, is accepted too)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from hybrid_sgl.batch import ForwardBatch
from hybrid_sgl.config import AttentionSpec, Mamba2Spec, ModelConfig, MoESpec, checkpoint_fields, dt_limit
from hybrid_sgl.layers.attention import GatedAttention
from hybrid_sgl.layers.mamba2 import Mamba2Mixer
from hybrid_sgl.layers.nemotron_moe import NemotronMoE
from hybrid_sgl.layers.norm import RMSNorm
from hybrid_sgl.layers.relu2_mlp import Relu2MLP
from hybrid_sgl.models.base import Backends, HybridCausalLM

BLOCKS = {"M": ("mamba2", "none"), "*": ("full_attention", "none"), "-": ("none", "mlp"), "E": ("none", "moe")}
# layers_block_type names (current and legacy) -> pattern symbols
_BLOCK_NAMES = {"linear_attention": "M", "mamba": "M", "full_attention": "*", "attention": "*", "mlp": "-",
                "moe": "E"}


def block_pattern(hf: dict) -> str:
    """The per-layer block symbols, e.g. "M-M*-ME"."""
    types = hf.get("layers_block_type") or hf.get("layer_types")
    if types:
        unknown = sorted(set(types) - set(_BLOCK_NAMES))
        if unknown:
            raise ValueError(f"nemotron_h layers_block_type has unknown block types {unknown}; "
                             f"supported: {sorted(_BLOCK_NAMES)}")
        return "".join(_BLOCK_NAMES[t] for t in types)
    pattern = hf.get("hybrid_override_pattern")
    if not pattern:
        raise ValueError("nemotron_h config has neither layers_block_type nor hybrid_override_pattern")
    unknown = sorted(set(pattern) - set(BLOCKS))
    if unknown:
        raise ValueError(f"hybrid_override_pattern has unknown block symbols {unknown}; supported: "
                         "M (Mamba2), * (attention), - (MLP), E (MoE)")
    return pattern


def _first(hf: dict, *names, default=None):
    """The first of `names` present in the config (Nemotron-H configs use both spellings)."""
    return next((hf[n] for n in names if hf.get(n) is not None), default)


def parse_config(hf: dict, gen_eos: list[int]) -> ModelConfig:
    pattern = block_pattern(hf)
    if hf.get("mamba_hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"mamba_hidden_act {hf['mamba_hidden_act']!r} is not supported (supported: silu)")
    if ("-" in pattern or "E" in pattern) and hf.get("mlp_hidden_act", "relu2") != "relu2":
        raise ValueError(f"mlp_hidden_act {hf['mlp_hidden_act']!r} is not supported (supported: relu2)")
    heads = hf["num_attention_heads"]
    head_dim = _first(hf, "head_dim", "attention_head_dim", default=hf["hidden_size"] // heads)
    mamba2 = None
    if "M" in pattern:
        mamba2 = Mamba2Spec(
            num_heads=hf["mamba_num_heads"],
            head_dim=hf["mamba_head_dim"],
            state_size=hf["ssm_state_size"],
            n_groups=_first(hf, "n_groups", "mamba_n_groups", default=8),
            conv_kernel=_first(hf, "conv_kernel", "mamba_d_conv", default=4),
            chunk_size=_first(hf, "chunk_size", "mamba_chunk_size", default=128),
            conv_bias=bool(_first(hf, "use_conv_bias", "mamba_conv_bias", default=True)),
            proj_bias=bool(hf.get("use_bias", False)),
            # the clamp is time_step_limit (mamba_dt_limit in older configs), as in mamba_ssm; time_step_min
            # only initializes dt_bias in training (transformers >= 5.25 reads it the same way)
            dt_limit=dt_limit({"time_step_limit": _first(hf, "time_step_limit", "mamba_dt_limit", default=None)}),
        )
    moe = None
    if "E" in pattern:
        moe = MoESpec(
            num_experts=_first(hf, "n_routed_experts", "num_local_experts"),
            top_k=hf["num_experts_per_tok"],
            intermediate_size=hf["moe_intermediate_size"],
            norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
            shared_expert_intermediate_size=hf.get("moe_shared_expert_intermediate_size") or 0,
            shared_expert_gate=False,
            scoring="sigmoid",
            n_group=hf.get("n_group", 1),
            topk_group=hf.get("topk_group", 1),
            routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
            activation="relu2",
        )
    return ModelConfig(
        **checkpoint_fields(hf, gen_eos, "NemotronHForCausalLM"),
        hidden_size=hf["hidden_size"],
        intermediate_size=hf.get("intermediate_size", 0) or 0,
        rms_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        norm_offset=0.0,
        hidden_act=hf.get("mlp_hidden_act", "relu2"),
        tie_word_embeddings=False,  # transformers keeps Nemotron-H's own lm_head even under tie_word_embeddings
        context_length=hf.get("max_position_embeddings", 4096),
        layer_plan=tuple(BLOCKS[c] for c in pattern),
        attention=AttentionSpec(num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
                                head_dim=head_dim, rotary_dim=0, rope_theta=0.0, output_gate=False,
                                qk_norm=False),
        mamba2=mamba2,
        moe=moe,
        weight_prefix="backbone.",
        hf_text_config=hf,
    )


class NemotronHBlock(nn.Module):
    """RMSNorm -> mixer (Mamba2 / attention, reading the batch) or FFN (MLP / MoE) -> residual."""

    def __init__(self, mixer: nn.Module, reads_batch: bool, hidden_size: int, eps: float):
        super().__init__()
        self.norm = RMSNorm(hidden_size, eps)
        self.mixer = mixer
        self.reads_batch = reads_batch

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, fb: ForwardBatch):
        """x: the previous block's output [T, H]; residual: the stream before it (None at layer 0).
        Returns (this block's output, residual stream)."""
        if residual is None:
            h, residual = self.norm(x), x
        else:
            h, residual = self.norm.add(x, residual)
        return (self.mixer(h, fb) if self.reads_batch else self.mixer(h)), residual


class NemotronHForCausalLM(HybridCausalLM):
    tensor_parallel = True
    skipped_prefixes = ("mtp.", "backbone.mtp.")  # multi-token-prediction head
    embed_name = "embeddings.weight"
    final_norm_names = ("norm_f.weight",)

    def __init__(self, config: ModelConfig, backends: Backends, max_positions: int):
        c = config
        super().__init__(config, backends, RMSNorm(c.hidden_size, c.rms_norm_eps))
        del max_positions  # no rotary embedding
        bias = bool(c.hf_text_config.get("mlp_bias", False))
        kv_index, state_index = 0, 0
        for mixer_kind, ffn_kind in c.layer_plan:
            if mixer_kind == "mamba2":
                body = Mamba2Mixer(spec=c.mamba2, hidden_size=c.hidden_size, eps=c.rms_norm_eps,
                                   state_index=state_index, ops=backends.ssm)
                state_index += 1
            elif mixer_kind == "full_attention":
                body = GatedAttention(spec=c.attention, hidden_size=c.hidden_size, eps=c.rms_norm_eps,
                                      norm_offset=0.0, kv_index=kv_index, rotary=None, ops=backends.attention)
                kv_index += 1
            elif ffn_kind == "moe":
                body = NemotronMoE(spec=c.moe, hidden_size=c.hidden_size, bias=bias, ops=backends.moe,
                                   latent_size=c.hf_text_config.get("moe_latent_size"))
            else:
                body = Relu2MLP(c.hidden_size, c.intermediate_size, bias)
            reads_batch = mixer_kind != "none"
            self.layers.append(NemotronHBlock(body, reads_batch, c.hidden_size, c.rms_norm_eps))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Accepts the original `backbone.` names and transformers' renamed `model.` ones."""
        super().load_weights(("backbone." + n[len("model."):] if n.startswith("model.") else n, t)
                             for n, t in weights)

    def load_layer_weight(self, layer: NemotronHBlock, part: str, rest: str, tensor: torch.Tensor) -> None:
        if part == "mixer":
            layer.mixer.load_weight(rest, tensor)
        elif part == "norm" and rest == "weight":
            layer.norm.weight.data.copy_(tensor)
        else:
            raise KeyError(f"{part}.{rest}")
