"""The composed hybrid (HybridSGLForCausalLM) served here against its reference model built from HF
transformers' modules, in float32: the matrix the families get (prefill and decode, odd chunked
prefill, staggered batches, preemption) on the 7-layer tiny config that uses every mixer and FFN
kind, the Triton kernels on the packed state pool, and random layer patterns."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_sgl.config import FFNS, MIXERS, ModelConfig
from hybrid_sgl.layers.backends import DenseOps, resolve_backends
from hybrid_sgl.models.registry import model_class
from hybrid_sgl.reference import load_reference
from hybrid_sgl.scheduler.request import Req
from hybrid_sgl.scheduler.scheduler import Scheduler
from hybrid_sgl.testing.tiny_composed import make_composed_checkpoint
from tests.test_hf_parity import TOL, dense, full_request, make_scheduler, prompt_of, run_to_end

_REFERENCES: dict[str, torch.nn.Module] = {}


@pytest.fixture(scope="module")
def composed(tmp_path_factory) -> str:
    return make_composed_checkpoint(str(tmp_path_factory.mktemp("composed")))


def reference_logprobs(path: str, ids: list[int]) -> torch.Tensor:
    """[len(ids) - 1, V]: the reference's log-softmax at positions 0..L-2."""
    if path not in _REFERENCES:
        _REFERENCES[path] = load_reference(path)
    with torch.no_grad():
        return _REFERENCES[path](torch.tensor([ids])).logits[0, :-1].float().log_softmax(-1)


def check_against_reference(path: str, req: Req, vocab: int) -> None:
    ids = req.prompt_ids + req.output_ids
    ref = reference_logprobs(path, ids)
    ours = dense(req.input_top_logprobs[1:] + req.output_top_logprobs, vocab)
    torch.testing.assert_close(ours, ref, **TOL)
    assert req.output_ids == ref[len(req.prompt_ids) - 1:].argmax(-1).tolist()


def run_and_check(path: str, s: Scheduler, arrivals: dict[int, list[Req]]) -> None:
    run_to_end(s, arrivals)
    for reqs in arrivals.values():
        for req in reqs:
            check_against_reference(path, req, s.vocab_size)


def test_plan_and_packed_state_layout(composed):
    s = make_scheduler(composed)
    config = s.runner.config
    assert {m for m, _ in config.layer_plan} == {"mamba2", "full_attention", "linear_attention", "mamba",
                                                 "attention_mamba2", "none"}
    assert {f for _, f in config.layer_plan} == {"mlp", "moe", "none"}
    # Mamba2 has the largest states: conv 3 x (128 + 2 x 2 x 16), ssm 8 x 16 x 16
    assert config.recurrent_state_shapes() == ((1, 576), (2048,))
    pool = s.runner.state_pool
    assert pool.conv.shape[0] == len(config.state_layers) == 5
    assert s.runner.plan.state_bytes_per_request == 5 * (576 + 2048) * 4  # float32 conv and ssm states
    lines = s.runner.model.dispatch_plan()
    assert "attention_mamba2" in lines[4] and "[torch+torch]" in lines[4]


@pytest.mark.parametrize("chunk", [-1, 5, 13])
def test_prefill_and_decode_match_reference(composed, chunk):
    s = make_scheduler(composed, chunked_prefill_size=chunk)
    vocab = s.vocab_size
    run_and_check(composed, s, {0: [full_request("a", prompt_of(37, 0, vocab), vocab)]})


def test_batch_with_staggered_arrivals_matches_reference(composed):
    s = make_scheduler(composed, chunked_prefill_size=16)
    vocab = s.vocab_size
    reqs = [full_request(f"r{i}", prompt_of(n, i, vocab), vocab, max_new=m)
            for i, (n, m) in enumerate([(23, 9), (5, 4), (41, 6), (1, 5)])]
    run_and_check(composed, s, {0: [reqs[0]], 2: [reqs[1], reqs[2]], 5: [reqs[3]]})


def test_preempted_requests_resume_and_match_reference(composed):
    # 12 pages of 4 tokens: two 20-token requests growing to 32 cannot both stay resident
    s = make_scheduler(composed, chunked_prefill_size=8, page_size=4, max_total_tokens=48, max_running_requests=3)
    vocab = s.vocab_size
    reqs = [full_request(f"p{i}", prompt_of(20, 10 + i, vocab), vocab, max_new=12) for i in range(3)]
    run_and_check(composed, s, {0: reqs})
    assert s.num_preemptions > 0
    assert s.allocator.num_free_pages == s.allocator.num_pages


def _kernel_choices(composed: str, **flags) -> dict[str, str]:
    """Module name -> the backend of every kernel bundle it holds ("torch" or "triton"), for the composed
    model built on the meta device with its backends resolved for CUDA from `flags`."""
    config = ModelConfig.from_hf(composed)
    backends = resolve_backends(config, "cuda", **{"attention": "torch", "linear_attention": "torch", "moe": "torch",
                                                  **flags})
    with torch.device("meta"):
        model = model_class(config)(config, backends, 64)
    choices = {}
    for name, module in model.named_modules():
        ops = vars(module).get("ops")
        if isinstance(ops, DenseOps):
            choices[name] = ops.name
        elif ops is not None:  # a mixer's or MoE block's bundle and the dense ops it hands its parts
            choices[name] = f"{ops.name}/{ops.dense.name}"
    return choices


def test_every_kernel_choice_follows_the_flags(composed):
    """Resolved for CUDA: with every flag torch, no module holds a Triton function; --attention-backend
    triton alone moves the attention mixers (projections, q/k norm and rotary, output gate included) to
    Triton, and with them the parts no flag names (layer norms, dense MLPs, the final norm)."""
    assert set(_kernel_choices(composed).values()) == {"torch", "torch/torch"}
    plan = ModelConfig.from_hf(composed).layer_plan

    def expected(name: str) -> str:
        if name == "norm":
            return "triton"
        _, i, part, *rest = name.split(".")
        mixer, ffn = plan[int(i)]
        if part in ("input_norm", "post_norm"):
            return "triton"
        if part == "ffn":
            return "triton" if ffn == "mlp" else "torch"
        return "triton" if mixer == "full_attention" or rest[:1] == ["self_attn"] else "torch"

    choices = _kernel_choices(composed, attention="triton")
    assert "triton" in {expected(name) for name in choices} and "torch" in {expected(name) for name in choices}
    for name, backend in choices.items():
        assert set(backend.split("/")) == {expected(name)}, name


def test_triton_kernels_on_packed_states_match_reference(composed):
    """GDN, Mamba2 and Mamba kernels in Triton (the interpreter on CPU) read and write their states
    through the packed pool's strided views: chunked prefill, a second request joining, decode."""
    s = make_scheduler(composed, chunked_prefill_size=7, linear_attn_backend="triton")
    assert "[triton]" in s.runner.model.dispatch_plan()[2]
    vocab = s.vocab_size
    reqs = [full_request(f"t{i}", prompt_of(n, 30 + i, vocab), vocab, max_new=m)
            for i, (n, m) in enumerate([(11, 3), (4, 2)])]
    run_and_check(composed, s, {0: [reqs[0]], 2: [reqs[1]]})


LAYER = st.tuples(st.sampled_from(MIXERS), st.sampled_from(FFNS)).filter(lambda layer: layer != ("none", "none"))


@settings(max_examples=5, deadline=None)
@given(plan=st.lists(LAYER, min_size=2, max_size=6))
def test_random_layer_patterns_match_reference(tmp_path_factory, plan):
    path = make_composed_checkpoint(str(tmp_path_factory.mktemp("pattern")), seed=len(plan),
                                    mixer_types=[m for m, _ in plan], ffn_types=[f for _, f in plan])
    s = make_scheduler(path, chunked_prefill_size=6)
    vocab = s.vocab_size
    reqs = [full_request("x", prompt_of(15, 3, vocab), vocab, max_new=4),
            full_request("y", prompt_of(4, 4, vocab), vocab, max_new=3)]
    run_and_check(path, s, {0: [reqs[0]], 1: [reqs[1]]})


# other dimensions and options of every kind: tied embeddings, MHA with full rotary and biases, GDN
# with Hk == Hv and K != V, 3-wide convs, Mamba2 with one group, projection biases, no conv bias, a
# dt clamp and a 5-token scan chunk, Mamba with expand 1, MoE top-3 of 6 without renormalization
VARIANT = dict(
    tie_word_embeddings=True,
    full_attention=dict(num_attention_heads=2, num_key_value_heads=2, head_dim=32, attention_bias=True,
                        rope_parameters=dict(rope_type="default", rope_theta=1e6, partial_rotary_factor=1.0)),
    linear_attention=dict(linear_num_key_heads=3, linear_num_value_heads=3, linear_key_head_dim=16,
                          linear_value_head_dim=24, linear_conv_kernel_dim=3),
    mamba2=dict(mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=8, mamba_d_conv=3, mamba_expand=2,
                mamba_chunk_size=5, mamba_conv_bias=False, mamba_proj_bias=True, time_step_limit=[0.01, 10.0]),
    mamba=dict(mamba_d_state=5, mamba_d_conv=3, mamba_expand=1, mamba_dt_rank=6, mamba_conv_bias=False,
               mamba_proj_bias=True),
    moe=dict(num_experts=6, num_experts_per_tok=3, moe_intermediate_size=24, shared_expert_intermediate_size=40,
             norm_topk_prob=False),
)


def test_other_dimensions_match_reference(tmp_path_factory):
    path = make_composed_checkpoint(str(tmp_path_factory.mktemp("variant")), seed=5, **VARIANT)
    s = make_scheduler(path, chunked_prefill_size=11)
    vocab = s.vocab_size
    run_and_check(path, s, {0: [full_request(f"v{i}", prompt_of(n, 20 + i, vocab), vocab)
                                for i, n in enumerate([29, 3])]})


def test_prefix_cache_changes_no_token_and_no_logprob(composed):
    """The prefix cache's scenario (shared system prompt, multi-turn chat, prompts diverging inside a
    page, n = 4 samples): snapshots copy the packed state rows of every kind, and restoring them gives
    the tokens and logprobs of a run without the cache."""
    from tests.test_prefix_cache_families import assert_same_outputs, check_predicted_cached_tokens, run_both

    plain, cached = run_both(composed)
    for case in plain:
        assert_same_outputs(plain[case], cached[case])
    check_predicted_cached_tokens(cached)
