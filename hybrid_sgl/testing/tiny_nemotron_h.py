"""Tiny Nemotron-H checkpoints: every block kind of `hybrid_override_pattern` (M Mamba2, * attention
without rope, - relu2 MLP, E sigmoid-routed MoE with grouped top-k and a shared expert)."""

from __future__ import annotations

# Six blocks, each kind at least once, attention after a Mamba2 block and an MoE block last.
TINY_NEMOTRON_H = dict(
    hidden_size=64, hybrid_override_pattern="M*M-ME", num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    intermediate_size=96, mamba_num_heads=8, mamba_head_dim=8, n_groups=2, ssm_state_size=16, conv_kernel=4,
    chunk_size=8, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    moe_shared_expert_intermediate_size=48, n_group=2, topk_group=1, routed_scaling_factor=2.5,
    norm_topk_prob=True, max_position_embeddings=4096, initializer_range=0.1, layer_norm_epsilon=1e-5,
)


def build(vocab_size: int, eos_token_id: int, **overrides):
    """A randomly initialized NemotronHForCausalLM; `overrides` replace TINY_NEMOTRON_H entries."""
    import torch
    import transformers as tf

    dims = {**TINY_NEMOTRON_H, "vocab_size": vocab_size, "eos_token_id": eos_token_id, **overrides}
    model = tf.NemotronHForCausalLM(tf.NemotronHConfig(**dims))
    with torch.no_grad():  # buffers the generic perturbation does not reach
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(torch.randn(buf.shape) * 0.05)
    return model
