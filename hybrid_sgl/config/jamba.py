"""Jamba: Mamba-1 and attention layers, each followed by a dense MLP or a sparse MoE, placed by
attn_layer_period/offset and expert_layer_period/offset."""

from __future__ import annotations

import math

from hybrid_sgl.config.model_config import AttentionSpec, MambaSpec, ModelConfig, MoESpec, checkpoint_fields


def layer_plan(hf: dict) -> tuple[tuple[str, str], ...]:
    """(mixer, ffn) per layer: attention where i % attn_layer_period == attn_layer_offset (else
    Mamba), MoE where i % expert_layer_period == expert_layer_offset and there are experts."""
    attn_period, attn_offset = hf.get("attn_layer_period", 8), hf.get("attn_layer_offset", 4)
    expert_period, expert_offset = hf.get("expert_layer_period", 2), hf.get("expert_layer_offset", 1)
    for name, offset, period in (("attn", attn_offset, attn_period), ("expert", expert_offset, expert_period)):
        if not 0 <= offset < period:
            raise ValueError(f"{name}_layer_offset={offset} must lie in [0, {name}_layer_period={period})")
    has_experts = hf.get("num_experts", 16) > 1
    return tuple(
        ("full_attention" if i % attn_period == attn_offset else "mamba",
         "moe" if has_experts and i % expert_period == expert_offset else "mlp")
        for i in range(hf["num_hidden_layers"])
    )


def parse_config(hf: dict, gen_eos: list[int]) -> ModelConfig:
    """JambaConfig (config.json as a dict) -> ModelConfig."""
    if hf.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported for Jamba (supported: silu)")
    plan = layer_plan(hf)
    hidden = hf["hidden_size"]
    heads = hf["num_attention_heads"]
    dt_rank = hf.get("mamba_dt_rank", "auto")
    moe = None
    if any(ffn == "moe" for _, ffn in plan):
        moe = MoESpec(num_experts=hf["num_experts"], top_k=hf.get("num_experts_per_tok", 2),
                      intermediate_size=hf["intermediate_size"], norm_topk_prob=False,
                      shared_expert_intermediate_size=0, shared_expert_gate=False)
    return ModelConfig(
        **checkpoint_fields(hf, gen_eos, "JambaForCausalLM"),
        hidden_size=hidden,
        intermediate_size=hf["intermediate_size"],
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        norm_offset=0.0,
        hidden_act="silu",
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        context_length=hf.get("max_position_embeddings", 262144),
        layer_plan=plan,
        attention=AttentionSpec(
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hidden // heads,
            rotary_dim=0,
            rope_theta=0.0,
            output_gate=False,
            qk_norm=False,
        ),
        mamba=MambaSpec(
            intermediate_size=hf.get("mamba_expand", 2) * hidden,
            state_size=hf.get("mamba_d_state", 16),
            conv_kernel=hf.get("mamba_d_conv", 4),
            dt_rank=math.ceil(hidden / 16) if dt_rank == "auto" else int(dt_rank),
            conv_bias=hf.get("mamba_conv_bias", True),
            proj_bias=hf.get("mamba_proj_bias", False),
        ),
        moe=moe,
        hf_text_config=hf,
    )
