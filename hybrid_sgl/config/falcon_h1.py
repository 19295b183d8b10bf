"""Falcon-H1: every layer runs attention and Mamba2 in parallel (layer-plan mixer "attention_mamba2"),
then a gated MLP; the mup multipliers stay in `hf_text_config` for the model to fold into its weights."""

from __future__ import annotations

from hybrid_sgl.config.model_config import (
    AttentionSpec,
    Mamba2Spec,
    ModelConfig,
    checkpoint_fields,
    dt_limit,
    rope_params,
)


def parse_config(hf: dict, gen_eos: list[int]) -> ModelConfig:
    if hf.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported (supported: silu)")
    if hf.get("mlp_bias", False):
        raise ValueError("falcon_h1 with mlp_bias=true is not supported (the gated MLP has no biases)")
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hidden // heads
    theta, _ = rope_params(hf)  # transformers rotates the whole head whatever partial_rotary_factor says
    d_ssm = hf.get("mamba_d_ssm") or int(hf.get("mamba_expand", 2) * hidden)
    n_heads = hf.get("mamba_n_heads", 128)
    d_head = hf.get("mamba_d_head", "auto")
    d_head = d_ssm // n_heads if d_head in (None, "auto") else d_head
    if n_heads * d_head != d_ssm:
        raise ValueError(f"mamba_n_heads * mamba_d_head = {n_heads} * {d_head} != mamba_d_ssm = {d_ssm}")
    return ModelConfig(
        **checkpoint_fields(hf, gen_eos, "FalconH1ForCausalLM"),
        hidden_size=hidden,
        intermediate_size=hf["intermediate_size"],
        rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
        norm_offset=0.0,
        hidden_act=hf.get("hidden_act", "silu"),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        context_length=hf.get("max_position_embeddings", 8192),
        layer_plan=(("attention_mamba2", "mlp"),) * hf["num_hidden_layers"],
        attention=AttentionSpec(
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rotary_dim=head_dim,
            rope_theta=theta,
            output_gate=False,
            qk_norm=False,
            bias=bool(hf.get("attention_bias", False)),
            scale=head_dim**-0.5 * float(hf.get("key_multiplier", 1.0)),  # q.(m k) = m (q.k)
        ),
        mamba2=Mamba2Spec(
            num_heads=n_heads,
            head_dim=d_head,
            state_size=hf.get("mamba_d_state", 256),
            n_groups=hf.get("mamba_n_groups", 1),
            conv_kernel=hf.get("mamba_d_conv", 4),
            chunk_size=hf.get("mamba_chunk_size", 256),
            conv_bias=bool(hf.get("mamba_conv_bias", True)),
            proj_bias=bool(hf.get("mamba_proj_bias", False)),
            out_proj_bias=bool(hf.get("projectors_bias", False)),
            gated_norm=bool(hf.get("mamba_rms_norm", False)),
            norm_before_gate=bool(hf.get("mamba_norm_before_gate", True)),
            dt_limit=dt_limit(hf),
        ),
        weight_prefix="model.",
        hf_text_config=hf,
    )
