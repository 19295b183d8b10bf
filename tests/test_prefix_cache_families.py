"""The prefix cache on every family: greedy tokens and logprobs equal those without the cache
(1e-5, float32), and cached_tokens is what the design predicts, through a shared system prompt,
multi-turn chat, a prefix ending inside a page, prompts diverging inside a page and n = 4
seeded samples. One runner per family serves both schedulers (cache off, then on with the
overlap scheduler, whose deferred finishes cache one token more). tests/gpu runs the same on CUDA
through the Triton kernels and decode graphs."""

import pytest
import torch

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.memory.prefix_cache import PrefixCache
from hybrid_sgl.runner.model_runner import ModelRunner
from hybrid_sgl.sampling_params import SamplingParams
from hybrid_sgl.scheduler.prefix_sharing import PrefixSharing
from hybrid_sgl.scheduler.request import Req
from hybrid_sgl.scheduler.scheduler import Scheduler
from hybrid_sgl.server_args import ServerArgs

FAMILIES = ["qwen3_5", "qwen3_5_moe", "nemotron_h", "falcon_h1", "jamba"]
PAGE, INTERVAL, MIN_BRANCH = 16, 48, 8


def _tokens(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 300, (n,), generator=g).tolist()


def _req(rid, prompt, *, max_new=5, temperature=0.0, seed=None, device="cpu") -> Req:
    req = Req(rid=rid, prompt_ids=list(prompt), params=SamplingParams(max_new_tokens=max_new, temperature=temperature,
                                                                      ignore_eos=True, sampling_seed=seed),
              return_logprob=True, logprob_start_len=len(prompt))
    if seed is not None:
        req.generator = torch.Generator(device=device).manual_seed(seed)
    return req


def _serve(s: Scheduler, reqs: list[Req]) -> list[Req]:
    for r in reqs:
        s.add(r)
    while s.has_work:
        s.step()
        s.check_integrity()
    return reqs


def _scenario(s: Scheduler) -> dict[str, list[Req]]:
    system = _tokens(1, 100)
    out = {"system": [_serve(s, [_req("s0", system + _tokens(2, 9))])[0]]}
    out["system"] += _serve(s, [_req("s1", system + _tokens(3, 12))])
    out["system"] += _serve(s, [_req("s2", system + _tokens(4, 5))])
    turn1 = _serve(s, [_req("t1", _tokens(5, 30))])[0]
    turn2 = _serve(s, [_req("t2", turn1.prompt_ids + turn1.output_ids + _tokens(6, 7))])[0]
    turn3 = _serve(s, [_req("t3", turn2.prompt_ids + turn2.output_ids + _tokens(7, 11))])[0]
    out["chat"] = [turn1, turn2, turn3]
    stem = _tokens(8, 37)  # the prompts diverge inside the third page
    out["diverge"] = _serve(s, [_req("d0", stem + _tokens(9, 6)), _req("d1", stem + _tokens(10, 8))])
    prompt = _tokens(11, 40)
    device = s.runner.device
    out["n4"] = _serve(s, [_req(f"n{j}", prompt, temperature=0.8, seed=100 + j, device=device) for j in range(4)])
    return out


def run_both(path: str, **server_args) -> tuple[dict, dict]:
    """The scenario without the cache, then with it (overlapped decode on), on one runner."""
    args = ServerArgs(model_path=path, **{"device": "cpu", "dtype": "float32", "page_size": PAGE,
                                          "max_running_requests": 8, **server_args}).resolved()
    runner = ModelRunner(args, ModelConfig.from_hf(path))
    plain = _scenario(Scheduler(runner, allocator=runner.allocator, chunked_prefill_size=64))
    cache = PrefixCache(allocator=runner.allocator, state_pool=runner.state_pool, kv_pool=runner.kv_pool)
    sharing = PrefixSharing(cache, snapshot_interval=INTERVAL, min_branch_tokens=MIN_BRANCH)
    s = Scheduler(runner, allocator=runner.allocator, chunked_prefill_size=64, sharing=sharing, overlap=True)
    cached = _scenario(s)
    assert s.flush_cache()
    s.check_integrity()
    a = runner.allocator
    assert (a.num_free_pages, a.num_free_snapshots) == (a.num_pages, a.num_snapshots)
    return plain, cached


def assert_same_outputs(plain: list[Req], cached: list[Req], tol: float = 1e-5) -> None:
    for a, b in zip(plain, cached):
        assert a.output_ids == b.output_ids, (a.rid, a.output_ids, b.output_ids)
        diff = max(abs(x - y) for (x, _), (y, _) in zip(a.output_token_logprobs, b.output_token_logprobs))
        assert diff < tol, (a.rid, diff)
        assert a.cached_tokens == 0


@pytest.fixture(scope="module", params=FAMILIES)
def runs(request, tiny_checkpoint):
    return run_both(tiny_checkpoint(request.param))


@pytest.mark.parametrize("case", ["system", "chat", "diverge", "n4"])
def test_cache_changes_no_token_and_no_logprob(runs, case):
    plain, cached = runs
    assert_same_outputs(plain[case], cached[case])


def test_cached_tokens_are_what_the_design_predicts(runs):
    check_predicted_cached_tokens(runs[1])


def check_predicted_cached_tokens(c: dict[str, list[Req]]) -> None:
    # s0 (109 tokens) runs [0, 64) and [64, 109) and leaves snapshots at 48 and 96 (the interval, taken
    # inside the chunks), 64 (chunk end), 109 (prompt end) and 113 (its end). s1 and s2 follow s0's
    # pages to 96 (page 6 holds s0's own tokens from 100): both restore the snapshot at 96.
    assert [r.cached_tokens for r in c["system"]] == [0, 96, 96]
    t1, t2, t3 = c["chat"]  # each turn restores the previous one's end: prompt + answer - 1
    assert [t2.cached_tokens, t3.cached_tokens] == [len(t1.fill_ids) - 1, len(t2.fill_ids) - 1]
    # d0 and d1 arrive together and share 37 tokens: d0 takes a snapshot at 37 (inside page 2) in the
    # middle of its chunk, and d1, held back one step, restores it and its partial page
    assert [r.cached_tokens for r in c["diverge"]] == [0, 37]
    # four samples of one 40-token prompt: n0 snapshots 39, the others restore it and compute 1 token
    assert [r.cached_tokens for r in c["n4"]] == [0, 39, 39, 39]


def test_engine_n4_with_a_seed_equals_four_seeded_requests(tiny_checkpoint):
    """Engine API: n = 4 with sampling_seed s (the prompt prefilled once, three samples restoring its
    snapshot) gives the tokens of four separate requests seeded s..s+3 on an engine without the cache."""
    from hybrid_sgl import Engine

    path = tiny_checkpoint("qwen3_5")
    prompt = _tokens(12, 90)
    params = {"max_new_tokens": 6, "temperature": 0.9, "ignore_eos": True}
    with Engine(model_path=path, device="cpu", dtype="float32") as engine:
        outs = engine.generate(input_ids=prompt, sampling_params={**params, "n": 4, "sampling_seed": 11})
    with Engine(model_path=path, device="cpu", dtype="float32", disable_radix_cache=True) as engine:
        alone = [engine.generate(input_ids=prompt, sampling_params={**params, "sampling_seed": 11 + j})
                 for j in range(4)]
    assert [o["output_ids"] for o in outs] == [a["output_ids"] for a in alone]
    assert [o["meta_info"]["cached_tokens"] for o in outs] == [0, 89, 89, 89]
