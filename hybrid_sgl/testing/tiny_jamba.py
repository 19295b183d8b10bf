"""Tiny Jamba checkpoints: Mamba-1 and attention layers, dense MLP and MoE feed-forwards.

The default plan of 6 layers (attention every 3rd from layer 1, MoE every 2nd from layer 1) has
every pairing: mamba+mlp (0, 2), attention+moe (1), mamba+moe (3, 5), attention+mlp (4)."""

from __future__ import annotations

TINY_JAMBA = dict(hidden_size=64, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=48, attn_layer_period=3, attn_layer_offset=1, expert_layer_period=2,
                  expert_layer_offset=1, num_experts=4, num_experts_per_tok=2, mamba_d_state=8, mamba_d_conv=4,
                  mamba_expand=2, mamba_dt_rank="auto", max_position_embeddings=4096, initializer_range=0.1)


def build(vocab_size: int, eos_token_id: int, **overrides):
    """A randomly initialized JambaForCausalLM; `overrides` replace TINY_JAMBA's fields."""
    import torch
    import transformers as tf

    config = tf.JambaConfig(**{**TINY_JAMBA, "vocab_size": vocab_size, "eos_token_id": eos_token_id,
                               "pad_token_id": eos_token_id, "bos_token_id": None, **overrides})
    model = tf.JambaForCausalLM(config)
    gen = torch.Generator().manual_seed(vocab_size)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".D"):  # HF starts D at ones: make the skip path per-channel
                p.add_(torch.randn(p.shape, generator=gen) * 0.3)
    return model
