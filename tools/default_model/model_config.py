"""The default model's shape: a Qwen3.5 text model (HF `Qwen3_5TextConfig`) with 8 layers in the family's
3:1 pattern (3 Gated DeltaNet layers, then 1 gated attention layer, twice), hidden 320, tied embeddings.
11.5 M parameters: 23 MB of bf16 safetensors.

Attention: 4 query heads, 2 KV heads, head_dim 64 (rotary on a quarter of it, as in Qwen3.5).
Gated DeltaNet: 2 key heads and 4 value heads of dim 64 (GQA as in Qwen3.5), short conv of width 4."""

from __future__ import annotations

DIMS = dict(
    hidden_size=320,
    intermediate_size=896,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=64,
    linear_value_head_dim=64,
    linear_conv_kernel_dim=4,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
    initializer_range=0.02,
)
LAYER_TYPES = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 2


def build_config(vocab_size: int, eos_token_id: int, pad_token_id: int):
    """The HF config for a tokenizer of `vocab_size` tokens."""
    import transformers as tf

    return tf.Qwen3_5TextConfig(**DIMS, layer_types=LAYER_TYPES, vocab_size=vocab_size, eos_token_id=eos_token_id,
                                pad_token_id=pad_token_id)


def build_model(tokenizer, seed: int):
    """A freshly initialized Qwen3_5ForCausalLM (float32) for `tokenizer`, from `seed`."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    config = build_config(len(tokenizer), tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id)
    return tf.Qwen3_5ForCausalLM(config)
