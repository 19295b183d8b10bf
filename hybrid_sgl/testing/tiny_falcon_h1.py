"""Tiny Falcon-H1 checkpoints: every layer runs rotary GQA attention and a Mamba2 mixer in parallel,
then a gated MLP; every mup multiplier is set away from 1 so that each one is checked."""

from __future__ import annotations

TINY_FALCON_H1 = dict(
    hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    intermediate_size=96, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8, mamba_n_groups=2, mamba_d_state=16,
    mamba_d_conv=4, mamba_chunk_size=8, mamba_rms_norm=True, mamba_norm_before_gate=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, max_position_embeddings=4096,
    initializer_range=0.1, embedding_multiplier=1.5, lm_head_multiplier=0.7, attention_in_multiplier=1.2,
    attention_out_multiplier=0.8, key_multiplier=0.6, ssm_in_multiplier=1.1, ssm_out_multiplier=0.9,
    ssm_multipliers=[0.5, 1.5, 0.8, 1.2, 0.9], mlp_multipliers=[1.3, 0.7],
)


def build(vocab_size: int, eos_token_id: int, **overrides):
    """A randomly initialized FalconH1ForCausalLM; `overrides` replace TINY_FALCON_H1 entries."""
    import transformers as tf

    dims = {**TINY_FALCON_H1, "vocab_size": vocab_size, "eos_token_id": eos_token_id, **overrides}
    return tf.FalconH1ForCausalLM(tf.FalconH1Config(**dims))
