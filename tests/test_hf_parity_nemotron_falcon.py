"""Nemotron-H and Falcon-H1 against HF transformers in float32 on tiny checkpoints, beyond the shared
matrix of tests/test_hf_parity.py (prefill and decode, odd chunking, staggered batches,
preemption): other dimensions and options, the config parsers' layer plans and their refusals,
and a greedy Engine run against HF generate."""

import pytest
import torch

from hybrid_sgl import Engine
from hybrid_sgl.config import ModelConfig, falcon_h1, nemotron_h
from tests.test_hf_parity import (
    TOL,
    check_variant_matches_hf,
    dense,
    full_request,
    make_scheduler,
    prompt_of,
    run_to_end,
)

FAMILIES = ["nemotron_h", "falcon_h1"]


VARIANTS = {
    # attention first and MHA; ungrouped routing without renormalization, latent experts, biases on
    # the MLPs and the Mamba2 projections, no conv bias, one SSM group, conv width 3, an active dt floor,
    # tie_word_embeddings set (which transformers ignores for this family: the LM head stays its own)
    "nemotron_h-options": ("nemotron_h", dict(
        hybrid_override_pattern="*ME-M*E", num_attention_heads=2, num_key_value_heads=2, head_dim=32,
        n_routed_experts=6, num_experts_per_tok=3, n_group=1, topk_group=1, norm_topk_prob=False,
        routed_scaling_factor=1.0, moe_latent_size=24, mlp_bias=True, use_bias=True, use_conv_bias=False,
        n_groups=1, mamba_num_heads=4, mamba_head_dim=16, conv_kernel=3, time_step_min=0.3, time_step_max=0.6,
        tie_word_embeddings=True)),
    # no mixer norm (z gate in the scan), in_proj bias without out_proj bias, attention biases, one SSM
    # group, wider attention heads than hidden / heads, MQA, conv width 3 without bias, tied embeddings
    "falcon_h1-no-norm": ("falcon_h1", dict(
        mamba_rms_norm=False, mamba_proj_bias=True, projectors_bias=False, attention_bias=True, mamba_n_groups=1,
        head_dim=24, num_key_value_heads=1, mamba_d_ssm=48, mamba_n_heads=6, mamba_d_head=8, mamba_d_conv=3,
        mamba_conv_bias=False, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        tie_word_embeddings=True)),
    # norm before the gate over 4 groups, out_proj bias only, d_ssm from mamba_expand, dt capped at 1
    "falcon_h1-norm-before-gate": ("falcon_h1", dict(
        mamba_norm_before_gate=True, projectors_bias=True, mamba_n_groups=4, mamba_d_ssm=None, mamba_expand=2,
        mamba_n_heads=8, mamba_d_head="auto", time_step_limit=(0.0, 1.0), num_hidden_layers=3)),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_other_dimensions_match_hf(tiny_checkpoint, variant):
    family, overrides = VARIANTS[variant]
    path = tiny_checkpoint(family, **overrides)
    check_variant_matches_hf(path)


def test_nemotron_h_without_attention_matches_hf(tiny_checkpoint):
    """No KV layer at all (no KV pool); 2 of 4 expert groups, one SSM head per group, chunk 16. HF's
    cache cannot hold a model without attention layers, so HF runs uncached."""
    import transformers as tf

    path = tiny_checkpoint("nemotron_h", hybrid_override_pattern="ME-M", n_group=4, topk_group=2, n_groups=4,
                           mamba_num_heads=4, mamba_head_dim=16, ssm_state_size=8, chunk_size=16)
    s = make_scheduler(path, chunked_prefill_size=11)
    vocab = s.vocab_size
    reqs = [full_request(f"s{i}", prompt_of(n, 30 + i, vocab), vocab) for i, n in enumerate([29, 3])]
    run_to_end(s, {0: reqs[:1], 2: reqs[1:]})
    hf = tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for req in reqs:
        ids = req.prompt_ids + req.output_ids
        with torch.no_grad():
            ref = hf(torch.tensor([ids]), use_cache=False).logits[0, :-1].float().log_softmax(-1)
        torch.testing.assert_close(dense(req.input_top_logprobs[1:] + req.output_top_logprobs, vocab), ref, **TOL)
        assert req.output_ids == ref[len(req.prompt_ids) - 1:].argmax(-1).tolist()


def test_nemotron_h_layer_plan_from_pattern_or_list(tiny_checkpoint):
    config = ModelConfig.from_hf(tiny_checkpoint("nemotron_h"))  # saved as layers_block_type
    assert config.layer_plan == (("mamba2", "none"), ("full_attention", "none"), ("mamba2", "none"),
                                 ("none", "mlp"), ("mamba2", "none"), ("none", "moe"))
    assert config.kv_layers == [1] and config.state_layers == [0, 2, 4]
    assert config.attention.rotary_dim == 0 and config.moe.scoring == "sigmoid"
    hf = dict(config.hf_text_config)
    del hf["layers_block_type"]
    hf["hybrid_override_pattern"] = "M*M-ME"
    assert nemotron_h.parse_config(hf, []).layer_plan == config.layer_plan
    hf["hybrid_override_pattern"] = "M*X"
    with pytest.raises(ValueError, match="unknown block symbols"):
        nemotron_h.parse_config(hf, [])
    hf["hybrid_override_pattern"], hf["mlp_hidden_act"] = "M-", "gelu"
    with pytest.raises(ValueError, match="mlp_hidden_act 'gelu' is not supported"):
        nemotron_h.parse_config(hf, [])


def test_falcon_h1_layers_own_a_kv_and_a_state_layer(tiny_checkpoint):
    config = ModelConfig.from_hf(tiny_checkpoint("falcon_h1"))
    assert config.layer_plan == (("attention_mamba2", "mlp"),) * 4
    assert config.kv_layers == config.state_layers == [0, 1, 2, 3]
    assert config.attention.scale == pytest.approx(16**-0.5 * 0.6)  # key_multiplier
    hf = {**config.hf_text_config, "mlp_bias": True}
    with pytest.raises(ValueError, match="mlp_bias"):
        falcon_h1.parse_config(hf, [])
    hf = {**config.hf_text_config, "mamba_d_head": 5}
    with pytest.raises(ValueError, match="mamba_d_ssm"):
        falcon_h1.parse_config(hf, [])


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_greedy_matches_hf_generate(tiny_checkpoint, family):
    import transformers as tf

    path = tiny_checkpoint(family)
    engine = Engine(model_path=path, dtype="float32", device="cpu", chunked_prefill_size=16, log_level="warning")
    try:
        hf = tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        prompt = "The capital of France is"
        ids = engine.tokenizer(prompt, return_tensors="pt").input_ids
        ref = hf.generate(ids, max_new_tokens=10, do_sample=False)[0, ids.shape[1]:].tolist()
        out = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 10})
        assert out["output_ids"] == ref
        engine.check_integrity()
    finally:
        engine.shutdown()
