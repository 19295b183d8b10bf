"""Sampler: each filter leaves exactly the allowed tokens, seeds reproduce, penalties apply; logprobs are
the model's, over the tokens a grammar mask allows."""

import torch

from hybrid_sgl.runner.sampler import ids_logprobs, logprobs_of, sample
from hybrid_sgl.sampling_params import SamplingParams
from hybrid_sgl.scheduler.request import Req

PROBS = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])


def draws(params: dict, n=400, output_ids=(), seed=0) -> set[int]:
    logits = PROBS.log().repeat(n, 1)
    reqs = []
    for i in range(n):
        r = Req(rid=str(i), prompt_ids=[5], params=SamplingParams.from_dict(params), output_ids=list(output_ids))
        r.generator = torch.Generator().manual_seed(seed + i)
        reqs.append(r)
    return set(sample(logits, reqs, eos_ids=(5,)).tolist())


def test_filters_keep_exactly_the_allowed_tokens():
    assert draws({}) == {0, 1, 2, 3, 4, 5}
    assert draws({"top_k": 2}) == {0, 1}
    assert draws({"top_p": 0.7}) == {0, 1, 2}  # 0.40 + 0.25 < 0.7 -> the third is still needed
    assert draws({"min_p": 0.3}) == {0, 1, 2}  # >= 0.3 * 0.40
    assert draws({"temperature": 0}) == {0}
    assert draws({"min_new_tokens": 2, "max_new_tokens": 4}, output_ids=[1]) == {0, 1, 2, 3, 4}  # eos masked
    assert draws({"stop_token_ids": [0], "min_new_tokens": 1}) == {1, 2, 3, 4}  # stop ids and eos


def test_temperature_sharpens_and_seeds_reproduce():
    logits = PROBS.log().repeat(2000, 1)

    def freq(temperature, seed):
        reqs = []
        for i in range(2000):
            r = Req(rid="x", prompt_ids=[0], params=SamplingParams(temperature=temperature))
            r.generator = torch.Generator().manual_seed(seed * 10_000 + i)
            reqs.append(r)
        return torch.bincount(sample(logits, reqs, ()), minlength=6) / 2000

    base = freq(1.0, 0)
    assert torch.allclose(base, PROBS, atol=0.04)
    assert freq(0.5, 0)[0] > base[0] + 0.1
    assert torch.equal(freq(1.0, 3), freq(1.0, 3))


def test_penalties_and_logit_bias():
    logits = PROBS.log()[None]
    req = Req(rid="p", prompt_ids=[3], params=SamplingParams(temperature=0, frequency_penalty=2.0),
              output_ids=[0, 0])
    assert sample(logits, [req], ()).item() == 1  # token 0 pushed down by 2 * 2
    req = Req(rid="p", prompt_ids=[0], params=SamplingParams(temperature=0, repetition_penalty=2.0))
    assert sample(logits, [req], ()).item() == 1  # log 0.4 * 2 < log 0.25
    req = Req(rid="b", prompt_ids=[0], params=SamplingParams(temperature=0, logit_bias={4: 10.0}))
    assert sample(logits, [req], ()).item() == 4


def test_logprobs_are_of_the_raw_distribution():
    logits = torch.randn(3, 7)
    ids = torch.tensor([1, 2, 3])
    chosen, tops = logprobs_of(logits, ids, top_k=2)
    ref = logits.log_softmax(-1)
    assert torch.allclose(torch.tensor(chosen), ref[[0, 1, 2], ids])
    assert [t[0][1] for t in tops] == ref.argmax(-1).tolist()


def bitmask(allowed: list[list[int] | None], vocab: int) -> torch.Tensor:
    """[N, ceil(V / 32)] int32 grammar bitmask allowing these tokens per row (None: every token)."""
    mask = torch.zeros(len(allowed), (vocab + 31) // 32, dtype=torch.int32)
    for row, ids in enumerate(allowed):
        if ids is None:
            mask[row] = -1
            continue
        for t in ids:
            word = int(mask[row, t // 32]) | (1 << (t % 32))
            mask[row, t // 32] = word - (1 << 32) if word >= 1 << 31 else word
    return mask


def test_logprobs_with_a_grammar_are_of_the_masked_distribution():
    vocab = 70
    logits = torch.randn(3, vocab)
    allowed = [[3, 31, 32, 69], None, [40]]  # row 1 has no grammar (its mask allows every token)
    mask = bitmask(allowed, vocab)
    ids = torch.tensor([31, 5, 40])
    chosen, tops = logprobs_of(logits, ids, top_k=6, mask=mask)
    masked = torch.full_like(logits, float("-inf"))
    for row, keep in enumerate(allowed):
        keep = list(range(vocab)) if keep is None else keep
        masked[row, keep] = logits[row, keep]
    ref = masked.log_softmax(-1)
    assert torch.allclose(torch.tensor(chosen), ref[[0, 1, 2], ids])
    assert torch.allclose(ref[0, allowed[0]].exp().sum(), torch.tensor(1.0))  # the allowed tokens' mass is 1
    assert chosen[2] == 0.0  # the only allowed token
    assert sorted(i for _, i in tops[0]) == allowed[0]  # top logprobs: allowed tokens only, however many asked
    assert [i for _, i in tops[2]] == [40]
    assert [i for _, i in tops[1]] == logits[1].topk(6).indices.tolist()  # the unconstrained row is untouched
    assert torch.allclose(torch.tensor([v for v, _ in tops[1]]), logits[1].log_softmax(-1).topk(6).values)
    unmasked, _ = logprobs_of(logits, ids, top_k=0)
    assert unmasked[1] == chosen[1] and unmasked[0] < chosen[0]


def test_token_ids_logprobs_with_a_grammar():
    vocab = 40
    logits = torch.randn(2, vocab)
    mask = bitmask([[1, 2], None], vocab)
    out = ids_logprobs(logits, [[1, 2, 7], [1, 7]], mask)
    ref = logits[0, [1, 2]].log_softmax(-1)
    assert torch.allclose(torch.tensor([lp for lp, _ in out[0][:2]]), ref)
    assert out[0][2] == (float("-inf"), 7)  # forbidden: no probability
    assert out[1] == ids_logprobs(logits, [None, [1, 7]])[1]
