"""Nemotron-H (and Nemotron-3 MoE): the block kinds come from `hybrid_override_pattern` (M Mamba2,
* attention, - MLP, E MoE) or its list form `layers_block_type`; each block is one layer of the plan,
its mixer or its FFN "none"."""

from __future__ import annotations

from hybrid_sgl.config.model_config import AttentionSpec, Mamba2Spec, ModelConfig, MoESpec, checkpoint_fields, dt_limit

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
