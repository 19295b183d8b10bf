"""The fast sampler against sample_ref: the same filtered distribution (support and probabilities),
the same draws from the same generators, and token frequencies that a chi-square test cannot tell
from the reference's exact probabilities."""

import os
import random

import pytest
import torch

from hybrid_sgl.runner.sampler import BatchParams, Sampler, _keep, _kept_probs, filtered_probs, sample, sample_ref
from hybrid_sgl.runner.warm_up import warm_up_sampler
from hybrid_sgl.sampling_params import SamplingParams
from hybrid_sgl.scheduler.request import Req
from triton_kernels.sampling import top_logits

# distinct probabilities, so that the frequencies identify the distribution
LOGITS = torch.tensor([2.0, 1.6, 1.3, 1.0, 0.7, 0.3, 0.0, -0.4, -0.9, -1.5])
DRAWS = 20_000
P_VALUE = 1e-3  # fixed seeds: each verdict is deterministic
# the Triton draw on these CPU tensors needs the interpreter; on a CUDA host tests/gpu/test_sampler_cuda.py
interpreted = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="Triton on CPU tensors")


def reqs_of(params: dict, n: int, seed: int | None = None, rid: str = "r") -> list[Req]:
    reqs = [Req(rid=f"{rid}{i}", prompt_ids=[0], params=SamplingParams.from_dict(params)) for i in range(n)]
    if seed is not None:
        for i, r in enumerate(reqs):
            r.generator = torch.Generator().manual_seed(seed * 100_003 + i)
    return reqs


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """P-value of the counts under probs; tokens outside the support must never be drawn."""
    support = probs > 0
    assert counts[~support].sum() == 0, f"drew tokens outside the support: {counts.tolist()}"
    expected = probs[support].double() * counts.sum()
    stat = ((counts[support].double() - expected) ** 2 / expected).sum()
    df = torch.tensor(float(support.sum() - 1), dtype=torch.float64)
    return torch.special.gammaincc(df / 2, stat / 2).item()


CONFIGS = {
    "temperature": ({"temperature": 0.7}, None, 1024),
    "top_k": ({"top_k": 4}, None, 1024),
    "top_p": ({"top_p": 0.8}, None, 1024),
    "top_p_past_candidates": ({"top_p": 0.9}, None, 2),  # the full-sort fallback
    "min_p": ({"min_p": 0.15}, None, 1024),
    "combined": ({"temperature": 1.3, "top_k": 7, "top_p": 0.9, "min_p": 0.05}, None, 3),
    "seeded": ({"temperature": 0.8, "top_p": 0.85}, 7, 4),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_frequencies_match_the_reference_probabilities(name):
    params, seed, candidates = CONFIGS[name]
    reqs = reqs_of(params, DRAWS, seed)
    exact = filtered_probs(LOGITS[None], reqs[:1])[0]
    torch.manual_seed(1234)
    counts = torch.bincount(sample(LOGITS.repeat(DRAWS, 1), reqs, (), candidates=candidates), minlength=len(LOGITS))
    assert chi_square_p(counts, exact) > P_VALUE, (name, counts.tolist(), exact.tolist())
    # the same counts reject the nearby distributions: unfiltered, or at a temperature 0.1 off
    temperature = params.get("temperature", 1.0)
    for wrong_temperature in (temperature, temperature + 0.1):
        wrong = (LOGITS / wrong_temperature).softmax(-1)
        if not torch.allclose(wrong, exact):
            assert chi_square_p(counts, wrong) < 1e-6, (name, wrong_temperature)


def random_batch(rng: random.Random, vocab: int, n: int) -> tuple[torch.Tensor, list[Req]]:
    """bf16-rounded logits (ties are common, as from a bf16 lm_head) and random knobs per row."""
    gen = torch.Generator().manual_seed(rng.randrange(1 << 31))
    logits = (torch.randn(n, vocab, generator=gen) * rng.choice([0.5, 2.0, 5.0])).bfloat16().float()
    reqs = []
    for i in range(n):
        d = {"temperature": rng.choice([0.0, 0.5, 1.0, 1.3])}
        if rng.random() < 0.5:
            d["top_k"] = rng.randint(2, vocab)
        if rng.random() < 0.5:
            d["top_p"] = rng.choice([0.3, 0.8, 0.95, 0.999])
        if rng.random() < 0.4:
            d["min_p"] = rng.choice([0.01, 0.1, 0.5])
        reqs.append(Req(rid=str(i), prompt_ids=[0], params=SamplingParams.from_dict(d)))
    return logits, reqs


def test_filtered_distribution_equals_the_reference():
    rng = random.Random(0)
    torch.manual_seed(0)
    fallbacks = 0
    for _ in range(100):
        vocab = rng.choice([7, 16, 50, 300])
        logits, reqs = random_batch(rng, vocab, rng.randint(1, 8))
        sampled = [i for i, r in enumerate(reqs) if not r.params.greedy]
        if not sampled:
            continue
        sub, sub_reqs = logits[sampled], [reqs[i] for i in sampled]
        ref = filtered_probs(sub, sub_reqs)
        for candidates in (1, 3, 1024):
            params = BatchParams.build(reqs, vocab, logits.device)
            fast = _kept_probs(sub, reqs, params, candidates)
            assert torch.equal(fast > 0, ref > 0), [r.params for r in sub_reqs]
            torch.testing.assert_close(fast / fast.sum(-1, keepdim=True), ref)
            probs = (sub / params.temperature).softmax(-1)
            fallbacks += len(_keep(probs, params, candidates)[1])
    assert fallbacks > 0  # the full-sort path ran


def test_ties_keep_the_lower_token_ids():
    flat = torch.zeros(1, 10)
    for params, kept in (({"top_k": 3}, {0, 1, 2}), ({"top_p": 0.25}, {0, 1, 2})):
        reqs = reqs_of(params, 1)
        assert set(filtered_probs(flat, reqs)[0].nonzero().flatten().tolist()) == kept
        for candidates in (1, 1024):
            fast = _kept_probs(flat, reqs, BatchParams.build(reqs, 10, flat.device), candidates)
            assert set(fast[0].nonzero().flatten().tolist()) == kept, (params, candidates)


def mixed_batch(seed: int) -> tuple[torch.Tensor, list[Req], torch.Tensor]:
    """Greedy, seeded and unseeded rows with every knob, logit bias, penalties, min_new_tokens and a
    grammar bitmask; returns (logits, reqs, mask)."""
    rng = random.Random(seed)
    logits, reqs = random_batch(rng, 64, 12)
    for i, r in enumerate(reqs):
        if i % 3 == 0:
            r.generator = torch.Generator().manual_seed(seed * 1000 + i)
    reqs[1].params.logit_bias = {5: 3.0}
    reqs[2].params.frequency_penalty, reqs[2].output_ids = 1.5, [3, 3, 4]
    reqs[4].params.repetition_penalty = 1.7
    reqs[5].params.min_new_tokens, reqs[5].output_ids = 3, [1]
    mask = torch.full((12, 2), -1, dtype=torch.int32)
    mask[7] = torch.tensor([0b1010_0001, 0], dtype=torch.int32)  # row 7 may take tokens 0, 5, 7
    return logits, reqs, mask


def test_same_seed_gives_the_reference_tokens():
    for seed in range(20):
        logits, reqs, mask = mixed_batch(seed)
        torch.manual_seed(seed)
        fast = sample(logits, reqs, eos_ids=(2,), mask=mask, candidates=3)
        logits, reqs, mask = mixed_batch(seed)  # fresh generators
        torch.manual_seed(seed)
        ref = sample_ref(logits, reqs, eos_ids=(2,), mask=mask)
        assert torch.equal(fast, ref), seed
        assert fast.dtype == torch.int64 and fast[7].item() in (0, 5, 7)
        assert fast[5].item() != 2  # eos masked below min_new_tokens


@interpreted
@pytest.mark.parametrize("name", list(CONFIGS))
def test_kernel_draws_are_the_torch_draws(name):
    """The Triton draw (logit-space boundary, kernels under the interpreter on CPU) takes the same
    noise from the same generators as the torch path, so it draws the same tokens; the torch path's
    frequencies are tested above (the CUDA suite repeats the chi-square test on the kernels)."""
    params, seed, candidates = CONFIGS[name]
    rows = 64
    logits = (LOGITS + torch.randn(rows, len(LOGITS), generator=torch.Generator().manual_seed(3)) * 0.3).bfloat16()
    logits = logits.float()
    logits[::7] = LOGITS  # and rows of the exact logits
    drawn = {}
    for kernels in (False, True):
        torch.manual_seed(99)
        drawn[kernels] = sample(logits, reqs_of(params, rows, seed), (), candidates=candidates, kernels=kernels)
    assert torch.equal(drawn[True], drawn[False]), name


@interpreted
def test_kernel_draws_in_mixed_batches():
    for seed in range(8):
        drawn = {}
        for kernels in (False, True):
            logits, reqs, mask = mixed_batch(seed)  # fresh generators
            torch.manual_seed(seed)
            drawn[kernels] = sample(logits, reqs, eos_ids=(2,), mask=mask, candidates=3, kernels=kernels)
        assert torch.equal(drawn[True], drawn[False]), seed


@interpreted
@pytest.mark.parametrize("candidates", [16, 1024])  # the torch path's; 16: its top_p rows take the full sort
def test_group_candidates_give_the_torch_draws(candidates, monkeypatch):
    """The candidates found through the group maxima (GROUP_CANDIDATES_MIN_ROWS) draw what the torch path draws.
    Top_p rows without top_k take none on the kernel path (they race), so top_k's 16 are its candidates."""
    from hybrid_sgl.runner import sampler as sampler_module

    calls = []
    monkeypatch.setattr(sampler_module, "GROUP_CANDIDATES_MIN_ROWS", 1)
    monkeypatch.setattr(sampler_module, "top_logits", lambda **kw: calls.append(kw["k"]) or top_logits(**kw))
    rows, vocab = 12, 2048
    logits = (torch.randn(rows, vocab, generator=torch.Generator().manual_seed(candidates)) * 3).bfloat16().float()
    knobs = [{"temperature": 0.8, "top_k": 1}, {"temperature": 1.2, "top_k": 5, "min_p": 0.05},
             {"temperature": 0.7, "top_k": 16, "top_p": 0.8}, {"temperature": 1.5, "top_p": 0.9},
             {"temperature": 1.0, "top_p": 0.5, "min_p": 0.2}, {"temperature": 0.6}]
    drawn = {}
    for kernels in (False, True):
        reqs = [Req(rid=str(i), prompt_ids=[0], params=SamplingParams.from_dict(knobs[i % len(knobs)]))
                for i in range(rows)]
        for i, r in enumerate(reqs[::3]):
            r.generator = torch.Generator().manual_seed(i)
        torch.manual_seed(8)
        drawn[kernels] = sample(logits, reqs, (), candidates=candidates, kernels=kernels)
    assert torch.equal(drawn[True], drawn[False])
    assert calls == [16]


@interpreted
@pytest.mark.parametrize("race", [8, 1])
@pytest.mark.parametrize("name", ["top_p", "top_p_past_candidates", "seeded", "combined"])
def test_top_p_rows_race_to_the_torch_draws(name, race, monkeypatch):
    """Top_p rows without top_k on the kernel path, with nothing read back: the winner found among the race's
    best tokens (TOP_P_RACE_CANDIDATES; with 1, many rows fall back to the search and draw again), against the
    torch path's boundary from its candidates or its full sort."""
    from hybrid_sgl.runner import sampler as sampler_module

    params, seed, candidates = CONFIGS[name]
    rows = 64
    logits = (LOGITS + torch.randn(rows, len(LOGITS), generator=torch.Generator().manual_seed(4)) * 0.3).bfloat16()
    logits = logits.float()
    drawn = {}
    for kernels in (False, True):
        torch.manual_seed(5)
        with monkeypatch.context() as patch:
            if kernels:
                patch.setattr(sampler_module, "TOP_P_RACE_CANDIDATES", race)
                patch.setattr(torch.Tensor, "nonzero", lambda *a, **k: pytest.fail("read back"))
            drawn[kernels] = sample(logits, reqs_of(params, rows, seed), (), candidates=candidates, kernels=kernels)
    assert torch.equal(drawn[True], drawn[False]), name


@interpreted
def test_kernel_draws_keep_the_lower_ids_of_ties():
    flat = torch.zeros(40, 10)
    for params, kept in (({"top_k": 3}, {0, 1, 2}), ({"top_p": 0.25}, {0, 1, 2})):
        for candidates in (1, 1024):
            drawn = sample(flat, reqs_of(params, 40, seed=5), (), candidates=candidates, kernels=True)
            assert set(drawn.tolist()) == kept, (params, candidates)


def test_greedy_rows_take_the_argmax():
    logits, reqs, _ = mixed_batch(3)
    greedy = [i for i, r in enumerate(reqs) if r.params.greedy]
    assert greedy and len(greedy) < len(reqs)
    out = sample(logits, reqs, ())
    adjusted = sample_ref(logits, [Req(rid="g", prompt_ids=[0], params=r.params, output_ids=r.output_ids)
                                   for r in reqs], ())
    assert out[greedy].tolist() == adjusted[greedy].tolist()
    all_greedy = reqs_of({"temperature": 0}, 4)
    x = torch.randn(4, 33)
    assert torch.equal(sample(x, all_greedy, ()), x.argmax(-1))


def test_sampler_keeps_params_for_the_same_requests_only():
    sampler = Sampler()
    logits = LOGITS.repeat(2000, 1)
    narrow = reqs_of({"top_k": 2}, 2000, seed=1)
    assert set(sampler(logits, narrow, ()).tolist()) == {0, 1}
    built = sampler.params_for(narrow, logits)
    assert sampler.params_for(list(narrow), logits) is built  # same requests: nothing rebuilt
    wide = reqs_of({"top_k": 6}, 2000, seed=1)  # same rids, new requests
    assert set(sampler(logits, wide, ()).tolist()) == set(range(6))
    assert sampler.params_for(wide, logits) is not built
    assert sampler.params_for(narrow, logits) is built  # the two most recent batches are kept
    assert sampler.params_for(narrow[:-1], logits) is not built
    assert sampler.params_for(wide, logits) is not sampler.params_for(narrow, logits)


def test_warm_up_leaves_the_default_generator_alone(tiny_checkpoint):
    from tests.test_hf_parity import make_scheduler  # builds a runner on the CPU (warm-up runs on CUDA only)

    runner = make_scheduler(tiny_checkpoint(), max_running_requests=6).runner
    torch.manual_seed(11)
    before = torch.get_rng_state()
    warm_up_sampler(runner)
    assert torch.equal(torch.get_rng_state(), before)


if __name__ == "__main__":  # time sample against sample_ref at the 9B vocabulary (any device)
    import sys
    import time

    device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    vocab = 248_320
    for batch in (1, 8, 32, 64):
        logits = torch.randn(batch, vocab, device=device) * 3  # a peaked row: top_p's mass within the candidates
        for knobs in ({"temperature": 0.7}, {"temperature": 0.7, "top_k": 50}, {"temperature": 0.7, "top_p": 0.9},
                      {"temperature": 0.7, "top_k": 50, "top_p": 0.9, "min_p": 0.05}):
            reqs = reqs_of(knobs, batch)
            sampler = Sampler()
            times = {}
            for name, fn in (("sample", sampler), ("sample_ref", sample_ref)):
                fn(logits, reqs, ())
                if device != "cpu":
                    torch.cuda.synchronize()
                start, steps = time.perf_counter(), 5 if device == "cpu" else 50
                for _ in range(steps):
                    fn(logits, reqs, ())
                if device != "cpu":
                    torch.cuda.synchronize()
                times[name] = (time.perf_counter() - start) / steps * 1e3
            print(f"batch {batch:3d} {knobs}: sample {times['sample']:.2f} ms, sample_ref {times['sample_ref']:.2f} ms")
