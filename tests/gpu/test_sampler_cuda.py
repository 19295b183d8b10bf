"""The sampler's Triton draw on CUDA: the same tokens as the torch path at the 9B vocabulary (the
same noise from the same generators), and frequencies that a chi-square test cannot tell from the
reference's exact probabilities. Skipped without CUDA."""

import pytest
import torch

from hybrid_sgl.runner.sampler import Sampler, filtered_probs, sample
from tests.test_sampler_exact import CONFIGS, DRAWS, LOGITS, P_VALUE, chi_square_p, reqs_of

pytestmark = pytest.mark.gpu

VOCAB = 248_320


@pytest.mark.parametrize("knobs", [{"temperature": 0.7}, {"temperature": 0.7, "top_k": 50, "top_p": 0.9},
                                   {"temperature": 0.7, "top_p": 0.9}, {"temperature": 1.2, "min_p": 0.05},
                                   {"temperature": 0.7, "top_k": 50, "top_p": 0.9, "min_p": 0.05}])
@pytest.mark.parametrize("scale", [0.5, 4.0])  # flat rows (top_p past the candidates) and peaked ones
@pytest.mark.parametrize("setting", [{}, {"GROUP_CANDIDATES_MIN_ROWS": 1 << 30},  # runner/sampler.py's, on 48 rows:
                                     {"GROUP_CANDIDATES_MIN_ROWS": 1}, {"TOP_P_RACE_CANDIDATES": 1}])  # else served
def test_kernel_draws_are_the_torch_draws_at_the_real_vocabulary(knobs, scale, setting, monkeypatch):
    from hybrid_sgl.runner import sampler as sampler_module

    for name, value in setting.items():
        monkeypatch.setattr(sampler_module, name, value)
    rows = 48
    gen = torch.Generator(device="cuda").manual_seed(7)
    logits = (torch.randn(rows, VOCAB, device="cuda", generator=gen) * scale).bfloat16().float()  # bf16 ties
    drawn = {}
    for kernels in (False, True):
        torch.manual_seed(5)
        reqs = reqs_of(knobs, rows)
        for i, r in enumerate(reqs[1::2]):  # every other row seeded, on the device as the server makes them
            r.generator = torch.Generator(device="cuda").manual_seed(i)
        drawn[kernels] = sample(logits, reqs, (), kernels=kernels)
    # equal but for a float near-tie: two tokens' w / E within rounding, or (flat rows, top_p past the
    # candidates) a token at the boundary of a 10^5-term cumulative sum that the two paths add differently
    agree = (drawn[True] == drawn[False]).sum().item()
    assert agree >= rows - 1, (knobs, scale, agree)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_kernel_frequencies_match_the_reference_probabilities(name):
    params, seed, candidates = CONFIGS[name]
    reqs = reqs_of(params, DRAWS, seed)
    for r in reqs:
        if r.generator is not None:
            r.generator = torch.Generator(device="cuda").manual_seed(r.generator.initial_seed())
    exact = filtered_probs(LOGITS[None], reqs[:1])[0]
    torch.manual_seed(1234)
    sampler = Sampler(candidates=candidates)  # on CUDA: the kernels
    drawn = sampler(LOGITS.cuda().repeat(DRAWS, 1), reqs, ())
    counts = torch.bincount(drawn.cpu(), minlength=len(LOGITS))
    assert chi_square_p(counts, exact) > P_VALUE, (name, counts.tolist(), exact.tolist())


@pytest.mark.parametrize("scale", [0.5, 4.0])
def test_served_draw_never_waits_for_the_device(scale):
    """Every filter, top_p alone included (its rows past the candidates searched on the device): nothing in a
    draw reads back to the host, so the overlapped decode keeps the next step queued."""
    logits = torch.randn(16, VOCAB, device="cuda") * scale
    knobs = [{"temperature": 0.7}, {"temperature": 0.7, "top_p": 0.9}, {"temperature": 0.7, "top_k": 50},
             {"temperature": 0.7, "top_k": 50, "top_p": 0.9, "min_p": 0.05}]
    reqs = [r for i, k in enumerate(knobs) for r in reqs_of(k, 4, seed=i if i % 2 else None)]
    for r in reqs:
        if r.generator is not None:
            r.generator = torch.Generator(device="cuda").manual_seed(r.generator.initial_seed())
    sampler = Sampler()
    sampler(logits, reqs, ())  # builds the batch's parameters (a copy to the device) and compiles
    torch.cuda.set_sync_debug_mode("error")
    try:
        drawn = sampler(logits, reqs, ())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert drawn.shape == (16,)
