"""Our serving path against HF transformers in float32 on the same tiny checkpoints.

Every request asks for the full distribution at every position (logprob_start_len=0,
top_logprobs_num=vocab), so the comparison covers prompt positions computed in prefill chunks
and every decode step, through allocator -> scheduler -> runner -> layers -> sampler."""

import pytest
import torch

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.layers.moe import SparseMoE
from hybrid_sgl.runner.model_runner import ModelRunner
from hybrid_sgl.sampling_params import SamplingParams
from hybrid_sgl.scheduler.request import Req
from hybrid_sgl.scheduler.scheduler import Scheduler
from hybrid_sgl.server_args import ServerArgs
from hybrid_sgl.testing.tiny_checkpoint import TINY_MOE

FAMILIES = ["qwen3_5", "qwen3_5_moe", "qwen3_next", "qwen3_5_vl", "qwen3_5_moe_vl",
            "nemotron_h", "falcon_h1", "bamba", "granitemoehybrid", "jamba"]
TOL = dict(rtol=1e-4, atol=1e-4)
_HF_CACHE: dict[str, torch.nn.Module] = {}


def hf_model(path: str):
    if path not in _HF_CACHE:
        import transformers as tf

        cls = tf.AutoModelForImageTextToText if "vl" in path else tf.AutoModelForCausalLM
        _HF_CACHE[path] = cls.from_pretrained(path, dtype=torch.float32).eval()
    return _HF_CACHE[path]


def hf_logprobs(path: str, ids: list[int]) -> torch.Tensor:
    """[len(ids) - 1, V]: log-softmax at positions 0..L-2 (each predicts the next token)."""
    with torch.no_grad():
        logits = hf_model(path)(torch.tensor([ids])).logits[0, :-1]
    return logits.float().log_softmax(-1)


def make_scheduler(path: str, **server_args) -> Scheduler:
    args = ServerArgs(model_path=path, **{"device": "cpu", "dtype": "float32", **server_args}).resolved()
    runner = ModelRunner(args, ModelConfig.from_hf(path))
    return Scheduler(runner, allocator=runner.allocator, chunked_prefill_size=args.chunked_prefill_size,
                     overlap=not args.disable_overlap_schedule)


def full_request(rid: str, prompt: list[int], vocab: int, max_new: int = 6) -> Req:
    return Req(rid=rid, prompt_ids=prompt, params=SamplingParams(max_new_tokens=max_new, temperature=0,
                                                                   ignore_eos=True),
               return_logprob=True, logprob_start_len=0, top_logprobs_num=vocab)


def dense(tops: list, vocab: int) -> torch.Tensor:
    out = torch.full((len(tops), vocab), float("nan"))
    for i, top in enumerate(tops):
        for lp, tid in top:
            out[i, tid] = lp
    return out


def check_against_hf(path: str, req: Req, vocab: int) -> None:
    ids = req.prompt_ids + req.output_ids
    ref = hf_logprobs(path, ids)
    ours = dense(req.input_top_logprobs[1:] + req.output_top_logprobs, vocab)
    torch.testing.assert_close(ours, ref, **TOL)
    assert req.output_ids == ref[len(req.prompt_ids) - 1:].argmax(-1).tolist()  # greedy picks
    chosen = torch.tensor([lp for lp, _ in req.input_token_logprobs[1:] + req.output_token_logprobs])
    torch.testing.assert_close(chosen, ref.gather(1, torch.tensor(ids[1:])[:, None]).flatten(), **TOL)


def run_to_end(s: Scheduler, arrivals: dict[int, list[Req]]) -> int:
    """Step the scheduler; arrivals[i] join before step i. Returns the number of steps."""
    step = 0
    while s.has_work or any(k >= step for k in arrivals):
        for req in arrivals.get(step, []):
            s.add(req)
        s.step()
        s.allocator.check_integrity()
        step += 1
        assert step < 500
    return step


def run_and_check(path: str, s: Scheduler, arrivals: dict[int, list[Req]]) -> None:
    """run_to_end, then every request against HF."""
    run_to_end(s, arrivals)
    for reqs in arrivals.values():
        for req in reqs:
            check_against_hf(path, req, s.vocab_size)


def check_variant_matches_hf(path: str) -> None:
    """Two prompts (29 and 3 tokens) arriving together, 11-token prefill chunks, against HF."""
    s = make_scheduler(path, chunked_prefill_size=11)
    vocab = s.vocab_size
    run_and_check(path, s, {0: [full_request(f"v{i}", prompt_of(n, 20 + i, vocab), vocab)
                                for i, n in enumerate([29, 3])]})


def prompt_of(n: int, seed: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("chunk", [-1, 7, 16])
def test_prefill_and_decode_match_hf(tiny_checkpoint, family, chunk):
    path = tiny_checkpoint(family)
    s = make_scheduler(path, chunked_prefill_size=chunk)
    vocab = s.vocab_size
    req = full_request("a", prompt_of(37, 0, vocab), vocab)
    run_to_end(s, {0: [req]})
    check_against_hf(path, req, vocab)


@pytest.mark.parametrize("family", FAMILIES)
def test_batch_with_staggered_arrivals_matches_hf(tiny_checkpoint, family):
    path = tiny_checkpoint(family)
    s = make_scheduler(path, chunked_prefill_size=16)
    vocab = s.vocab_size
    reqs = [full_request(f"r{i}", prompt_of(n, i, vocab), vocab, max_new=m)
            for i, (n, m) in enumerate([(23, 9), (5, 4), (41, 6), (1, 5)])]
    run_and_check(path, s, {0: [reqs[0]], 2: [reqs[1], reqs[2]], 5: [reqs[3]]})


@pytest.mark.parametrize("family", ["qwen3_5_moe", "qwen3_next", "granitemoehybrid", "jamba"])
def test_triton_moe_kernels_match_hf(tiny_checkpoint, family):
    """The MoE families through the Triton router top-k and fused MoE (in the interpreter on CPU):
    shared experts with and without a gate, renormalized or not."""
    path = tiny_checkpoint(family)
    s = make_scheduler(path, chunked_prefill_size=16, moe_runner_backend="triton")
    vocab = s.vocab_size
    reqs = [full_request(f"r{i}", prompt_of(n, i, vocab), vocab, max_new=m)
            for i, (n, m) in enumerate([(23, 5), (6, 4)])]
    run_and_check(path, s, {0: [reqs[0]], 2: [reqs[1]]})


@pytest.mark.parametrize("family,backend", [("qwen3_5_moe", "torch"), ("qwen3_next", "triton"),
                                            ("granitemoehybrid", "triton")])
def test_shared_expert_stacked_with_the_experts_matches_hf(tiny_checkpoint, family, backend):
    """A shared expert as wide as the routed ones is expert E of the stack, routed to every token with
    weight sigmoid(its gate), or 1 without one (Granite): the reference ops and the Triton kernels
    (interpreter) against HF."""
    width = TINY_MOE["moe_intermediate_size"]
    path = tiny_checkpoint(family, **{"shared_intermediate_size" if family == "granitemoehybrid"
                                      else "shared_expert_intermediate_size": width})
    s = make_scheduler(path, chunked_prefill_size=16, moe_runner_backend=backend)
    moe = next(m for m in s.runner.model.modules() if isinstance(m, SparseMoE))
    assert moe.stacked_shared and moe.shared is None and moe.w13.shape[0] == moe.spec.num_experts + 1
    vocab = s.vocab_size
    reqs = [full_request(f"s{i}", prompt_of(n, 30 + i, vocab), vocab, max_new=5) for i, n in enumerate([21, 4])]
    run_and_check(path, s, {0: [reqs[0]], 1: [reqs[1]]})


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_next", "nemotron_h", "falcon_h1", "bamba",
                                    "granitemoehybrid", "jamba"])
def test_preempted_requests_resume_and_match_hf(tiny_checkpoint, family):
    path = tiny_checkpoint(family)
    # 12 pages of 4 tokens: two 20-token requests growing to 32 cannot both stay resident
    s = make_scheduler(path, chunked_prefill_size=8, page_size=4, max_total_tokens=48, max_running_requests=3)
    vocab = s.vocab_size
    reqs = [full_request(f"p{i}", prompt_of(20, 10 + i, vocab), vocab, max_new=12) for i in range(3)]
    run_to_end(s, {0: reqs})
    assert s.num_preemptions > 0
    for req in reqs:
        check_against_hf(path, req, vocab)
    assert s.allocator.num_free_pages == s.allocator.num_pages


VARIANTS = {
    # other head shapes: K != V, Hk == Hv, wider heads, half rotary, tied embeddings, attention first
    "qwen3_5": dict(linear_key_head_dim=8, linear_value_head_dim=24, linear_num_key_heads=3,
                    linear_num_value_heads=3, head_dim=32, num_attention_heads=2, num_key_value_heads=1,
                    tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                               "partial_rotary_factor": 0.5},
                    layer_types=["full_attention", "linear_attention", "linear_attention", "full_attention"]),
    # sparse-step MoE with dense layers, no top-k renormalization, conv width 3
    "qwen3_next": dict(decoder_sparse_step=2, mlp_only_layers=[3], norm_topk_prob=False, attention_bias=True,
                       linear_conv_kernel_dim=3, num_experts=6, num_experts_per_tok=3, tie_word_embeddings=True),
    "qwen3_5_moe": dict(num_experts=8, num_experts_per_tok=1, linear_num_key_heads=4, linear_num_value_heads=4),
}


@pytest.mark.parametrize("family", sorted(VARIANTS))
def test_other_dimensions_match_hf(tiny_checkpoint, family):
    path = tiny_checkpoint(family, **VARIANTS[family])
    check_variant_matches_hf(path)


def test_the_oracle_loads_without_hub_kernels(tiny_checkpoint):
    """The oracle is HF's own code: where transformers' `kernels` package is missing (the GPU machine's
    wheels), a model still loads, as tests/conftest.py turns the hub-kernels integration off for every test
    (transformers >= 5.25 otherwise refuses: "Kernels are not available")."""
    import os
    import subprocess
    import sys

    path = tiny_checkpoint("qwen3_5")
    code = ("import sys; sys.modules['kernels'] = None; sys.modules['fla'] = None; import transformers as tf; "
            f"tf.AutoModelForCausalLM.from_pretrained({path!r}); print('loaded')")
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "loaded" in out.stdout, out.stderr[-2000:]
    assert os.environ.get("USE_HUB_KERNELS") == "0"
