"""Bamba (`model_type` bamba) and Granite-4.0-H (granitemoehybrid): Mamba2 and attention layers, each
followed by a gated MLP (Bamba) or Granite's routed MoE plus shared MLP (the shared MLP alone when
`num_local_experts` is 0). Granite's muP multipliers stay in `hf_text_config` for the model."""

from __future__ import annotations

from hybrid_sgl.config.model_config import (
    AttentionSpec,
    Mamba2Spec,
    ModelConfig,
    MoESpec,
    checkpoint_fields,
    dt_limit,
    rope_params,
)

GRANITE = "granitemoehybrid"
_MIXER_OF_LAYER_TYPE = {"mamba": "mamba2", "linear_attention": "mamba2",
                        "attention": "full_attention", "full_attention": "full_attention"}


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
        mamba2=mamba2_spec(hf),
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


def mamba2_spec(hf: dict) -> Mamba2Spec:
    """Bamba's Mamba2 dimensions (mamba_* fields); the composed hybrid's mamba2 section reads the same names."""
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
