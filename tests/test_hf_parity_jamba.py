"""Jamba against HF transformers in float32, beyond the shared matrix of tests/test_hf_parity.py
(prefill and decode, odd chunked prefill, staggered batches, preemption): the layer plan from
periods and offsets, other config options, the Triton kernels, a greedy Engine run."""

import pytest

from hybrid_sgl.config import ModelConfig
from tests.test_hf_parity import (
    check_variant_matches_hf,
    full_request,
    make_scheduler,
    prompt_of,
    run_and_check,
)

# full attention first, MHA, 3-wide conv, no conv bias, projection biases, explicit dt rank, narrower
# Mamba (expand 1), more experts with top-1, head_dim not hidden / heads, tied embeddings
VARIANT = dict(attn_layer_period=2, attn_layer_offset=0, expert_layer_period=3, expert_layer_offset=2,
               num_hidden_layers=5, num_attention_heads=2, num_key_value_heads=2, head_dim=24, mamba_d_conv=3,
               mamba_conv_bias=False, mamba_proj_bias=True, mamba_dt_rank=6, mamba_expand=1, mamba_d_state=5,
               num_experts=6, num_experts_per_tok=1, tie_word_embeddings=True)
DENSE = dict(num_experts=1, num_hidden_layers=4, attn_layer_period=4, attn_layer_offset=3)


def test_layer_plan_follows_periods_and_offsets(tiny_checkpoint):
    config = ModelConfig.from_hf(tiny_checkpoint("jamba"))
    assert config.layer_plan == (("mamba", "mlp"), ("full_attention", "moe"), ("mamba", "mlp"),
                                 ("mamba", "moe"), ("full_attention", "mlp"), ("mamba", "moe"))
    assert config.kv_layers == [1, 4] and config.state_layers == [0, 2, 3, 5]
    assert config.recurrent_state_shapes() == ((3, 128), (128, 8))
    assert config.mamba.dt_rank == 4 and config.attention.rotary_dim == 0
    assert not config.moe.norm_topk_prob and config.moe.shared_expert_intermediate_size == 0
    dense = ModelConfig.from_hf(tiny_checkpoint("jamba", **DENSE))
    assert dense.layer_plan == (("mamba", "mlp"),) * 3 + (("full_attention", "mlp"),) and dense.moe is None


def test_bad_offset_is_rejected():
    from hybrid_sgl.config.jamba import parse_config

    hf = dict(model_type="jamba", num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=2)
    with pytest.raises(ValueError, match="attn_layer_offset=2"):
        parse_config(hf, [])
    with pytest.raises(ValueError, match="hidden_act"):
        parse_config({**hf, "hidden_act": "gelu"}, [])


@pytest.mark.parametrize("variant", ["variant", "dense"])
def test_other_dimensions_match_hf(tiny_checkpoint, variant):
    path = tiny_checkpoint("jamba", **(VARIANT if variant == "variant" else DENSE))
    check_variant_matches_hf(path)


def test_triton_ssm_kernels_match_hf(tiny_checkpoint):
    """The Mamba layers through the Triton conv1d and selective-scan kernels (the interpreter on CPU):
    chunked prefill, a second request joining, and decode steps."""
    path = tiny_checkpoint("jamba")
    s = make_scheduler(path, chunked_prefill_size=7, linear_attn_backend="triton")
    assert "[triton]" in s.runner.model.dispatch_plan()[0]
    vocab = s.vocab_size
    reqs = [full_request(f"t{i}", prompt_of(n, 30 + i, vocab), vocab, max_new=m)
            for i, (n, m) in enumerate([(13, 4), (5, 3)])]
    run_and_check(path, s, {0: [reqs[0]], 2: [reqs[1]]})

def test_engine_greedy_matches_hf_generate(tiny_checkpoint):
    import torch
    import transformers as tf

    from hybrid_sgl import Engine

    path = tiny_checkpoint("jamba")
    hf = tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    engine = Engine(model_path=path, dtype="float32", device="cpu", chunked_prefill_size=16, log_level="warning")
    try:
        for prompt in ["The capital of France is", "Hello! How are you today? I am fine"]:
            ids = engine.tokenizer(prompt, return_tensors="pt").input_ids
            ref = hf.generate(ids, max_new_tokens=10, do_sample=False)[0, ids.shape[1]:].tolist()
            out = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 10})
            assert out["output_ids"] == ref
        engine.check_integrity()
    finally:
        engine.shutdown()
