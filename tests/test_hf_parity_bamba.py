"""Bamba and Granite-4.0-H (GraniteMoeHybrid) against HF transformers in float32, beyond the shared
matrix of tests/test_hf_parity.py (prefill and decode, odd chunking, staggered batches,
preemption): other config options, the config parser's layer plans and its rejections, and the
Granite router against HF's."""

import json

import pytest
import torch

from hybrid_sgl.config import ModelConfig
from tests.test_hf_parity import (
    check_variant_matches_hf,
    full_request,
    make_scheduler,
    prompt_of,
    run_and_check,
)

FAMILIES = ["bamba", "granitemoehybrid"]


VARIANTS = {
    # one B/C group, no conv bias, in/out projection biases, attention biases, full rope at another
    # theta, explicit head_dim, tied embeddings, attention first
    "bamba_variant": ("bamba", dict(mamba_n_groups=1, mamba_conv_bias=False, mamba_proj_bias=True,
                                    attention_bias=True, attn_layer_indices=[0, 3], num_hidden_layers=4,
                                    rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                     "partial_rotary_factor": 1.0},
                                    tie_word_embeddings=True, mamba_d_state=8, mamba_chunk_size=4)),
    # rope, MoE with 4 groups, top-1 of 6 experts, MHA, dt clamped from below and above
    "granite_rope_moe": ("granitemoehybrid", dict(position_embedding_type="rope", mamba_n_groups=4,
                                                  num_local_experts=6, num_experts_per_tok=1,
                                                  num_key_value_heads=4, time_step_limit=[0.05, 1.5],
                                                  rope_parameters={"rope_type": "default", "rope_theta": 500.0})),
    # dense: the shared MLP is the whole FFN; no rope; tied embeddings; proj biases; mamba heads of 32
    "granite_dense": ("granitemoehybrid", dict(num_local_experts=0, tie_word_embeddings=True, mamba_n_heads=4,
                                               mamba_proj_bias=True, attention_bias=True,
                                               layer_types=["attention", "mamba", "mamba", "attention"],
                                               num_hidden_layers=4)),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_other_dimensions_match_hf(tiny_checkpoint, variant):
    family, overrides = VARIANTS[variant]
    path = tiny_checkpoint(family, **overrides)
    check_variant_matches_hf(path)


def test_layer_plans_and_fields(tiny_checkpoint):
    bamba = ModelConfig.from_hf(tiny_checkpoint("bamba"))
    assert [m for m, _ in bamba.layer_plan] == ["mamba2", "full_attention", "mamba2", "mamba2", "full_attention"]
    assert {f for _, f in bamba.layer_plan} == {"mlp"} and bamba.moe is None
    assert bamba.attention.rotary_dim == 8 and bamba.attention.scale is None  # half of head_dim 16
    assert bamba.mamba2.head_dim == 16 and bamba.mamba2.conv_dim == 128 + 2 * 2 * 16
    assert bamba.kv_layers == [1, 4] and bamba.state_layers == [0, 2, 3]
    granite = ModelConfig.from_hf(tiny_checkpoint("granitemoehybrid"))
    assert [m for m, _ in granite.layer_plan] == [m for m, _ in bamba.layer_plan]
    assert {f for _, f in granite.layer_plan} == {"moe"} and granite.moe.shared_expert_intermediate_size == 48
    assert granite.attention.rotary_dim == 0 and granite.attention.scale == 0.125
    dense = ModelConfig.from_hf(tiny_checkpoint("granitemoehybrid", **VARIANTS["granite_dense"][1]))
    assert {f for _, f in dense.layer_plan} == {"mlp"} and dense.intermediate_size == 48


def _write_config(tmp_path, base: str, **changes) -> str:
    with open(f"{base}/config.json") as f:
        cfg = json.load(f)
    cfg.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def test_legacy_granite_layer_types(tmp_path, tiny_checkpoint):
    path = _write_config(tmp_path, tiny_checkpoint("granitemoehybrid"),
                         layer_types=["attention", "mamba", "mamba", "attention", "mamba"])
    plan = ModelConfig.from_hf(path).layer_plan
    assert [m for m, _ in plan] == ["full_attention", "mamba2", "mamba2", "full_attention", "mamba2"]


@pytest.mark.parametrize("family, changes, message", [
    ("bamba", dict(mlp_bias=True), "mlp_bias"),
    ("bamba", dict(hidden_act="gelu"), "hidden_act 'gelu'"),
    ("bamba", dict(attn_layer_indices=[1, 9]), r"attn_layer_indices \[9\]"),
    ("bamba", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}), "rope_type 'yarn'"),
    ("granitemoehybrid", dict(position_embedding_type="alibi"), "position_embedding_type 'alibi'"),
    ("granitemoehybrid", dict(layer_types=["mamba", "sliding_attention"] * 2 + ["mamba"]), "sliding_attention"),
    ("granitemoehybrid", dict(layer_types=["mamba"]), "layer_types has 1 entries"),
    ("granitemoehybrid", dict(mamba_n_heads=6, mamba_d_head=16), "mamba_n_heads=6"),
])
def test_unsupported_options_are_rejected(tmp_path, tiny_checkpoint, family, changes, message):
    path = _write_config(tmp_path, tiny_checkpoint(family), **changes)
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(path)


def test_granite_router_matches_hf():
    """Top-k logits then softmax (HF) == softmax, top-k, renormalize (SparseMoE), ids and weights."""
    import transformers as tf
    from transformers.models.granitemoehybrid import modeling_granitemoehybrid as hf_granite

    from hybrid_sgl.config import MoESpec
    from hybrid_sgl.layers.backends import resolve_backend
    from hybrid_sgl.layers.moe import SparseMoE

    cfg = tf.GraniteMoeHybridConfig(hidden_size=32, num_local_experts=7, num_experts_per_tok=3, mamba_n_heads=4)
    hf_router = hf_granite.GraniteMoeHybridTopKRouter(cfg)
    torch.nn.init.normal_(hf_router.weight, std=0.5)
    ours = SparseMoE(spec=MoESpec(num_experts=7, top_k=3, intermediate_size=8, norm_topk_prob=True,
                                  shared_expert_intermediate_size=0, shared_expert_gate=False),
                     hidden_size=32, ops=resolve_backend("moe", "torch", "cpu"))
    ours.router.data.copy_(hf_router.weight.data)
    x = torch.randn(50, 32, generator=torch.Generator().manual_seed(0))
    _, ref_weights, ref_ids = hf_router(x)
    weights, ids, shared_gate = ours.route(x)
    assert shared_gate is None
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_engine_greedy_matches_hf_generate(tiny_checkpoint, family):
    import transformers as tf

    from hybrid_sgl import Engine

    path = tiny_checkpoint(family)
    hf = tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with Engine(model_path=path, device="cpu", dtype="float32", chunked_prefill_size=16,
                log_level="warning") as engine:
        prompt = "The capital of France is Paris. The capital of Germany is"
        ids = engine.tokenizer(prompt, return_tensors="pt").input_ids
        ref = hf.generate(ids, max_new_tokens=10, do_sample=False)[0, ids.shape[1]:].tolist()
        out = engine.generate(prompt, {"temperature": 0, "max_new_tokens": 10})
        assert out["output_ids"] == ref and len(ref) > 0
        assert out["meta_info"]["finish_reason"]["type"] in ("length", "stop")
        engine.check_integrity()


def test_triton_ssm_kernels_match_hf(tiny_checkpoint):
    """The Mamba2 layers through the Triton conv1d, SSD prefill, SSM step and gated-norm kernels (the
    interpreter on CPU): chunked prefill, a second request joining, and decode steps. The kernels
    tile by chunks of at least 16 tokens."""
    family, overrides = VARIANTS["granite_rope_moe"]
    path = tiny_checkpoint(family, **{**overrides, "mamba_chunk_size": 16})
    s = make_scheduler(path, chunked_prefill_size=7, linear_attn_backend="triton")
    assert "[triton]" in s.runner.model.dispatch_plan()[0]
    vocab = s.vocab_size
    reqs = [full_request(f"t{i}", prompt_of(n, 30 + i, vocab), vocab, max_new=m)
            for i, (n, m) in enumerate([(13, 4), (5, 3)])]
    run_and_check(path, s, {0: [reqs[0]], 2: [reqs[1]]})
