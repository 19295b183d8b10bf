"""Tiny Bamba and Granite-4.0-H (GraniteMoeHybrid) checkpoints: Mamba2 layers with grouped B/C
and attention layers (GQA) in one stack, small SSM state and a chunk size shorter than the test
prompts so that HF's chunked scan crosses chunk boundaries."""

from __future__ import annotations

_MAMBA = dict(mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
              mamba_chunk_size=8)
_COMMON = dict(hidden_size=64, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=96, max_position_embeddings=4096, initializer_range=0.1, rms_norm_eps=1e-5)

BAMBA_DIMS = dict(_COMMON, **_MAMBA, attn_layer_indices=[1, 4],
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
# Granite-4.0-H: no rope by default, muP-style multipliers far from 1 so that each one is checked
GRANITE_DIMS = dict(_COMMON, **_MAMBA, layer_types=["mamba", "attention", "mamba", "mamba", "attention"],
                    intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, shared_intermediate_size=48,
                    embedding_multiplier=6.0, residual_multiplier=0.4, attention_multiplier=0.125,
                    logits_scaling=3.0, position_embedding_type="nope")


def _perturb_mamba_skips(model) -> None:
    """D starts at ones and A_log at log(1..H); give D noise too (make_checkpoint perturbs the rest)."""
    import torch

    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".D"):
                p.add_(torch.randn(p.shape, generator=gen) * 0.3)


def build_bamba(vocab_size: int, eos_token_id: int, **overrides):
    import transformers as tf

    config = tf.BambaConfig(**{**BAMBA_DIMS, "vocab_size": vocab_size, "eos_token_id": eos_token_id,
                               "pad_token_id": None, **overrides})
    model = tf.BambaForCausalLM(config)
    _perturb_mamba_skips(model)
    return model


def build_granite(vocab_size: int, eos_token_id: int, **overrides):
    import transformers as tf

    config = tf.GraniteMoeHybridConfig(**{**GRANITE_DIMS, "vocab_size": vocab_size, "eos_token_id": eos_token_id,
                                          "pad_token_id": None, **overrides})
    model = tf.GraniteMoeHybridForCausalLM(config)
    _perturb_mamba_skips(model)
    return model
