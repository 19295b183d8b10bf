"""Qwen3-Next, Qwen3.5 and Qwen3.5-MoE (model types qwen3_next, qwen3_5, qwen3_5_moe and their *_text
forms): the layer plan from `layer_types` (or `full_attention_interval`), MoE layers from
`decoder_sparse_step` and `mlp_only_layers`; multimodal checkpoints keep the text model in `text_config`."""

from __future__ import annotations

from hybrid_sgl.config.model_config import AttentionSpec, GDNSpec, ModelConfig, MoESpec, as_list, rope_params


def mtp_layers_of(text: dict) -> int:
    """The checkpoint's multi-token-prediction layers: `mtp_num_hidden_layers` (Qwen3.5) or
    `num_nextn_predict_layers` (Qwen3-Next); their own embedding table is not supported."""
    n = text.get("mtp_num_hidden_layers", text.get("num_nextn_predict_layers", 0)) or 0
    if n and text.get("mtp_use_dedicated_embeddings"):
        raise ValueError("mtp_use_dedicated_embeddings is not supported: the MTP layer shares the model's embedding")
    return int(n)


def parse_config(hf: dict, gen_eos: list[int]) -> ModelConfig:
    """Qwen3-Next, Qwen3.5 and Qwen3.5-MoE: GDN + gated attention, dense MLP or MoE."""
    text = hf.get("text_config", hf)
    nested = text is not hf
    n_layers = text["num_hidden_layers"]
    layer_types = text.get("layer_types") or [
        "linear_attention" if (i + 1) % text.get("full_attention_interval", 4) else "full_attention"
        for i in range(n_layers)
    ]
    num_experts = text.get("num_experts", 0) or 0
    moe = None
    if num_experts > 0:
        moe = MoESpec(
            num_experts=num_experts,
            top_k=text["num_experts_per_tok"],
            intermediate_size=text["moe_intermediate_size"],
            norm_topk_prob=text.get("norm_topk_prob", True),
            shared_expert_intermediate_size=text.get("shared_expert_intermediate_size", 0) or 0,
            shared_expert_gate=True,
        )
    sparse_step = text.get("decoder_sparse_step", 1)
    mlp_only = set(text.get("mlp_only_layers") or [])

    def ffn_of(i: int) -> str:
        is_moe = moe is not None and i not in mlp_only and (i + 1) % sparse_step == 0
        return "moe" if is_moe else "mlp"

    if text.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"hidden_act {text['hidden_act']!r} is not supported (supported: silu)")
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    theta, partial = rope_params(text)
    tie = hf.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    return ModelConfig(
        architecture=(hf.get("architectures") or ["Qwen3NextForCausalLM"])[0],
        model_type=hf["model_type"],
        vocab_size=text["vocab_size"],
        hidden_size=text["hidden_size"],
        intermediate_size=text.get("intermediate_size", 0) or 0,
        rms_norm_eps=text.get("rms_norm_eps", 1e-6),
        norm_offset=1.0,
        hidden_act=text.get("hidden_act", "silu"),
        tie_word_embeddings=bool(tie),
        context_length=text.get("max_position_embeddings", 32768),
        dtype=str(text.get("dtype") or text.get("torch_dtype") or hf.get("dtype") or "bfloat16"),
        layer_plan=tuple((layer_types[i], ffn_of(i)) for i in range(n_layers)),
        eos_token_ids=tuple(dict.fromkeys(gen_eos + as_list(text.get("eos_token_id"))
                                          + as_list(hf.get("eos_token_id")))),
        attention=AttentionSpec(
            num_heads=text["num_attention_heads"],
            num_kv_heads=text["num_key_value_heads"],
            head_dim=head_dim,
            rotary_dim=int(head_dim * partial),
            rope_theta=theta,
            output_gate=True,
            qk_norm=True,
            bias=text.get("attention_bias", False),
        ),
        gdn=GDNSpec(
            num_k_heads=text["linear_num_key_heads"],
            num_v_heads=text["linear_num_value_heads"],
            head_k_dim=text["linear_key_head_dim"],
            head_v_dim=text["linear_value_head_dim"],
            conv_kernel=text.get("linear_conv_kernel_dim", 4),
        ),
        moe=moe,
        weight_prefix="model.language_model." if nested else "model.",
        mtp_layers=mtp_layers_of(text),
        hf_text_config=text,
    )
