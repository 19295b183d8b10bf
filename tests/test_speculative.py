"""Speculative decoding (--speculative-algorithm NEXTN) on CPU, float32: greedy output equals plain
decoding exactly on every Qwen family with an MTP layer, alone and beside sampled, logprob and
constrained requests, through the prefix cache and preemption; max_new_tokens and stop tokens end
a verify row where plain decoding ends; the pools stay whole.

The tiny checkpoints' MTP layers are random, so their drafts are almost never accepted. To cover
acceptance and rollback at every depth, a test-only drafter replaces the MTP layer's proposals by
the true continuation with a set probability per token (a wrong token otherwise)."""

import random

import pytest
import torch

from hybrid_sgl.engine import Engine
from hybrid_sgl.runner.speculative import SpecDecoder
from hybrid_sgl.runner.verify_scoring import speculative_sample
from hybrid_sgl.server_args import ServerArgs

FAMILIES = ["qwen3_5", "qwen3_5_moe", "qwen3_next"]
BASE = dict(device="cpu", dtype="float32", log_level="warning")
SPEC = dict(speculative_algorithm="NEXTN", speculative_num_steps=3,
            disable_speculative_overlap=True)  # the host path; the chained iterations: tests/test_spec_chain.py
GREEDY = {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True}


def _ids(seed: int, n: int) -> list[int]:
    return torch.randint(3, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


PROMPTS = [_ids(1, 21), _ids(2, 40), _ids(3, 6), _ids(4, 70)]
SHARED_PREFIX_PROMPTS = [_ids(9, 50) + _ids(10 + i, 8 + 3 * i) for i in range(4)]  # one system prompt
TIGHT = dict(page_size=16, max_running_requests=4, max_total_tokens=160, chunked_prefill_size=32)  # preempts


def _generate(path: str, prompts, params, **kw) -> list[dict]:
    with Engine(model_path=path, **{**BASE, **kw}) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        engine.check_integrity()
        stats = engine.stats()
    return outs, stats


def generate_each(path: str, params: list[dict], logprobs_at: int, **kw) -> list[dict]:
    """PROMPTS one at a time, each with its params; the one at logprobs_at asks for logprobs, its 3 top
    logprobs and those of ids 7 and 11."""
    with Engine(model_path=path, **{**BASE, **kw}) as engine:
        outs = [engine.generate(input_ids=p, sampling_params=s, **(LOGPROBS if i == logprobs_at else {}))
                for i, (p, s) in enumerate(zip(PROMPTS, params))]
        engine.check_integrity()
    return outs


LOGPROBS = {"return_logprob": True, "top_logprobs_num": 3, "token_ids_logprob": [7, 11]}


class ScriptedDrafts:
    """Test-only drafts: the true next tokens (from a plain run), each kept with probability p, else a
    wrong token; the rest of a row's drafts follow the true continuation after the wrong one."""

    def __init__(self, truth: dict[tuple, list[int]], p: float, seed: int):
        self.truth, self.p, self.rng = truth, p, random.Random(seed)

    def __call__(self, spec: SpecDecoder, entries) -> list[list[int]]:
        out = []
        for e in entries:
            req = e.req
            future = self.truth[tuple(req.prompt_ids)][len(req.output_ids):]
            out.append([t if self.rng.random() < self.p else (t + 1) % 300 + 3 for t in future[:e.want]]
                       + [5] * max(0, e.want - len(future)))
        return out


@pytest.fixture(params=FAMILIES)
def mtp_checkpoint(request, tiny_checkpoint):
    return tiny_checkpoint(request.param, mtp=True)


def test_greedy_output_equals_plain_decoding_with_the_mtp_drafts(mtp_checkpoint):
    plain, _ = _generate(mtp_checkpoint, PROMPTS, GREEDY)
    spec, stats = _generate(mtp_checkpoint, PROMPTS, GREEDY, **SPEC)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in spec)
    assert "spec_verify_ct" not in plain[0]["meta_info"]
    assert stats["avg_spec_accept_length"] >= 1.0


@pytest.mark.parametrize("p", [0.5, 0.9, 1.0])
def test_accepted_drafts_and_rollback_keep_greedy_output_exact(tiny_checkpoint, monkeypatch, p):
    path = tiny_checkpoint("qwen3_5", mtp=True)
    params = {**GREEDY, "max_new_tokens": 23}
    plain, _ = _generate(path, PROMPTS, params)
    truth = {tuple(prompt): o["output_ids"] for prompt, o in zip(PROMPTS, plain)}
    scripted = ScriptedDrafts(truth, p, seed=int(p * 10))
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))
    spec, stats = _generate(path, PROMPTS, params, **SPEC)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert all(len(o["output_ids"]) == 23 for o in spec)  # max_new_tokens is never overshot
    verify_steps = sum(o["meta_info"]["spec_verify_ct"] for o in spec)
    assert verify_steps < sum(len(o["output_ids"]) for o in spec)
    assert stats["avg_spec_accept_length"] > (2.0 if p >= 0.9 else 1.2)


def test_stop_tokens_end_a_verify_row_where_plain_decoding_ends(tiny_checkpoint, monkeypatch):
    path = tiny_checkpoint("qwen3_5", mtp=True)
    plain, _ = _generate(path, PROMPTS, GREEDY)
    stop = plain[1]["output_ids"][6]  # a token the second prompt produces mid-way
    params = {**GREEDY, "stop_token_ids": [stop]}
    plain, _ = _generate(path, PROMPTS, params)
    truth = {tuple(prompt): o["output_ids"] + [7] * 20 for prompt, o in zip(PROMPTS, plain)}
    scripted = ScriptedDrafts(truth, 1.0, seed=0)
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))
    spec, _ = _generate(path, PROMPTS, params, **SPEC)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert [o["meta_info"]["finish_reason"] for o in spec] == [o["meta_info"]["finish_reason"] for o in plain]
    assert spec[1]["output_ids"][-1] == stop


def test_speculative_sampling_keeps_the_models_distribution():
    """A sampled verify row's first token has the distribution p0 whatever the draft, and its second,
    given that the first draft was kept, has p1 (chi-square, 40,000 rows)."""
    from tests.test_sampler_exact import chi_square_p

    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(3, 6, generator=gen) * 1.5, dim=-1)
    probs[1, 4] = 0.0  # a token top-k / top-p removed
    probs[1] /= probs[1].sum()
    for draft in ([2, 4], [5, 1]):
        first, second = torch.zeros(6), torch.zeros(6)
        for _ in range(40_000):
            out = speculative_sample(probs, draft, gen)
            first[out[0]] += 1
            if out[0] == draft[0]:
                second[out[1]] += 1
        assert chi_square_p(first, probs[0]) > 1e-3, (draft, first)
        assert chi_square_p(second, probs[1]) > 1e-3, (draft, second)


@pytest.mark.parametrize("rollback", ["snapshots", "replay"])
def test_sampled_logprob_and_constrained_requests_decode_beside_drafted_ones(tiny_checkpoint, monkeypatch, rollback):
    path = tiny_checkpoint("qwen3_5", mtp=True)
    greedy = dict(GREEDY)
    sampled = {**GREEDY, "temperature": 0.8, "sampling_seed": 5}
    constrained = {**GREEDY, "max_new_tokens": 8, "temperature": 0, "regex": "[0-9]+"}
    params = [greedy, sampled, constrained, greedy]
    plain = generate_each(path, params, logprobs_at=3)
    truth = {tuple(prompt): o["output_ids"] for prompt, o in zip(PROMPTS, plain)}
    scripted = ScriptedDrafts(truth, 0.8, seed=1)
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))
    spec = generate_each(path, params, logprobs_at=3, **SPEC, speculative_rollback=rollback)
    # the sampled request takes drafts too (speculative sampling: its distribution, not its draws, is kept)
    assert [spec[i]["output_ids"] for i in (0, 2, 3)] == [plain[i]["output_ids"] for i in (0, 2, 3)]
    assert len(spec[1]["output_ids"]) == len(plain[1]["output_ids"])
    assert spec[0]["meta_info"]["spec_verify_ct"] < len(spec[0]["output_ids"])
    assert spec[1]["meta_info"]["spec_verify_ct"] > 0
    # constrained: drafted too, each verify position under its grammar's mask
    assert 0 < spec[2]["meta_info"]["spec_verify_ct"] < len(spec[2]["output_ids"])
    # logprobs come off the verify rows: drafted, and each kept token's logprobs are plain decoding's
    assert 0 < spec[3]["meta_info"]["spec_verify_ct"] < len(spec[3]["output_ids"])
    for key in ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs"):
        got, want = spec[3]["meta_info"][key], plain[3]["meta_info"][key]
        assert len(got) == len(want) == len(plain[3]["output_ids"]), key
        assert [t for _, t, *_ in _flat(got)] == [t for _, t, *_ in _flat(want)], key
        assert [v for v, *_ in _flat(got)] == pytest.approx([v for v, *_ in _flat(want)], abs=1e-4), key


def test_logprobs_of_constrained_and_free_rows_in_one_verify_step(tiny_checkpoint, monkeypatch):
    """Four logprob requests in one batch, two of them constrained: their verify rows' logprobs are read in one
    pass, each under its own grammar's masks, and equal plain decoding's (tokens exact, values within 1e-4)."""
    path = tiny_checkpoint("qwen3_5", mtp=True)
    regex = {**GREEDY, "max_new_tokens": 12, "regex": "[a-z]+[0-9]"}
    params = [regex, GREEDY, regex, GREEDY]

    def run(**kw):
        with Engine(model_path=path, **BASE, **kw) as engine:
            outs = engine.generate(input_ids=PROMPTS, sampling_params=params, **LOGPROBS)
            engine.check_integrity()
        return outs

    plain = run()
    truth = {tuple(prompt): o["output_ids"] for prompt, o in zip(PROMPTS, plain)}
    scripted = ScriptedDrafts(truth, 0.8, seed=9)
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))
    spec = run(**SPEC)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert all(0 < o["meta_info"]["spec_verify_ct"] < len(o["output_ids"]) for o in spec)
    for got, want in zip(spec, plain):
        for key in ("output_token_logprobs", "output_top_logprobs", "output_token_ids_logprobs"):
            g, w = _flat(got["meta_info"][key]), _flat(want["meta_info"][key])
            assert [t for _, t, *_ in g] == [t for _, t, *_ in w], key
            assert [v for v, *_ in g] == pytest.approx([v for v, *_ in w], abs=1e-4), key


def _flat(rows: list) -> list:
    """Logprob entries (value, id, ...) of a meta_info list, whose rows are entries or lists of them."""
    return [x for row in rows for x in (row if row and isinstance(row[0], (list, tuple)) else [row])]


ADJUSTED = [  # logit bias, penalties over the output, min_new_tokens against an EOS the model favours
    {"logit_bias": {"7": 2.5, "11": -1.0}},
    {"frequency_penalty": 0.6, "presence_penalty": 0.4},
    {"repetition_penalty": 1.3},
    {"min_new_tokens": 9, "ignore_eos": False, "logit_bias": {"2": 4.0}},
]


@pytest.mark.parametrize("adjust", ADJUSTED, ids=["bias", "frequency_presence", "repetition", "min_new_tokens"])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_adjusted_requests_take_drafts_scored_as_plain_decoding_would(tiny_checkpoint, monkeypatch, adjust,
                                                                      temperature):
    """Bias, penalties and min_new_tokens apply at each verify position over the output as if the drafts
    before it were kept. Greedy: the tokens and finish reasons of plain decoding, and drafts accepted
    (fewer verify steps than tokens). Sampled: as many tokens as plain decoding."""
    path = tiny_checkpoint("qwen3_5", mtp=True)
    params = {**GREEDY, "max_new_tokens": 16, "temperature": temperature, "sampling_seed": 3, **adjust}
    plain, _ = _generate(path, PROMPTS, params)
    truth = {tuple(prompt): o["output_ids"] for prompt, o in zip(PROMPTS, plain)}
    scripted = ScriptedDrafts(truth, 0.9, seed=7)
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))
    spec, _ = _generate(path, PROMPTS, params, **SPEC)
    assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in spec)
    if temperature == 0.0:
        assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
        assert [o["meta_info"]["finish_reason"] for o in spec] == [o["meta_info"]["finish_reason"] for o in plain]
        assert sum(o["meta_info"]["spec_verify_ct"] for o in spec) < sum(len(o["output_ids"]) for o in spec)
    if "min_new_tokens" in adjust:
        assert all(len(o["output_ids"]) >= 9 for o in spec)


@pytest.mark.parametrize("regex", ["[0-9]{5}", "(ab|cd)+", "[a-z]+[0-9]"])
@pytest.mark.parametrize("p", [0.0, 0.7, 1.0])
def test_constrained_requests_take_drafts_their_grammar_allows(tiny_checkpoint, monkeypatch, regex, p):
    """Drafts for a constrained request are cut before the first its grammar rejects or that would end it,
    the rest verified under the grammar's mask at each position, and the matcher rolled back to the tokens
    kept: output and finish reason equal plain decoding's, for grammars that end and ones that do not, with
    drafts always wrong (p = 0, many rejected by the grammar), mostly right and always right."""
    path = tiny_checkpoint("qwen3_5", mtp=True)
    params = {"max_new_tokens": 12, "temperature": 0, "regex": regex}
    prompts = PROMPTS[:3]
    plain, _ = _generate(path, prompts, params)
    truth = {tuple(prompt): o["output_ids"] for prompt, o in zip(prompts, plain)}
    scripted = ScriptedDrafts(truth, p, seed=3)
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))
    spec, _ = _generate(path, prompts, params, **SPEC)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert [o["meta_info"]["finish_reason"] for o in spec] == [o["meta_info"]["finish_reason"] for o in plain]
    if p == 1.0:  # right drafts are kept: fewer verify steps than tokens
        assert all(o["meta_info"]["spec_verify_ct"] < len(o["output_ids"]) for o in spec)


@pytest.mark.parametrize("rollback", ["snapshots", "replay"])
def test_prefix_cache_hits_and_preemption_keep_greedy_output_exact(tiny_checkpoint, monkeypatch, rollback):
    path = tiny_checkpoint("qwen3_5", mtp=True)
    prompts, tight = SHARED_PREFIX_PROMPTS, TIGHT
    plain, _ = _generate(path, prompts, GREEDY, **tight)
    truth = {tuple(prompt): o["output_ids"] for prompt, o in zip(prompts, plain)}
    scripted = ScriptedDrafts(truth, 0.7, seed=2)
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))
    with Engine(model_path=path, **BASE, **tight, **SPEC, speculative_rollback=rollback) as engine:
        first = engine.generate(input_ids=prompts, sampling_params=GREEDY)
        again = engine.generate(input_ids=prompts[0][:60], sampling_params=GREEDY)
        preemptions = engine.run_on_engine(lambda s: s.num_preemptions)
        engine.check_integrity()
    assert [o["output_ids"] for o in first] == [o["output_ids"] for o in plain]
    assert preemptions > 0
    assert again["meta_info"]["cached_tokens"] >= 48
    plain_again, _ = _generate(path, [prompts[0][:60]], GREEDY)
    assert again["output_ids"] == plain_again[0]["output_ids"]


def test_models_without_an_mtp_layer_and_tree_drafts_are_refused(tiny_checkpoint):
    with pytest.raises(ValueError, match="has none"):
        Engine(model_path=tiny_checkpoint("qwen3_5"), **BASE, **SPEC)
    with pytest.raises(ValueError, match="has none"):
        Engine(model_path=tiny_checkpoint("nemotron_h"), **BASE, **SPEC)
    with pytest.raises(ValueError, match="eagle-topk"):
        ServerArgs(model_path=tiny_checkpoint("qwen3_5", mtp=True), **BASE, **SPEC,
                   speculative_eagle_topk=2).resolved()
    with pytest.raises(ValueError, match="num-draft-tokens"):
        ServerArgs(model_path=tiny_checkpoint("qwen3_5", mtp=True), **BASE, **SPEC,
                   speculative_num_draft_tokens=3).resolved()


def test_the_mtp_layer_loads_and_plain_serving_skips_it(tiny_checkpoint):
    path = tiny_checkpoint("qwen3_5_moe", mtp=True)
    with Engine(model_path=path, **BASE, **SPEC) as engine:
        mtp = engine.runner.model.mtp
        assert mtp is not None and len(mtp.layers) == 1
        assert not any(torch.isnan(p).any() for p in mtp.parameters())
        info = engine.server_info()
        assert info["speculative_algorithm"] == "NEXTN"
        assert info["speculative_num_draft_tokens"] == info["speculative_num_steps"] + 1  # in force, as SGLang says
    with Engine(model_path=path, **BASE) as engine:
        assert engine.runner.model.mtp is None
        assert engine.server_info()["speculative_num_draft_tokens"] is None


def test_verify_steps_run_the_recurrent_layers_token_by_token(tiny_checkpoint, monkeypatch):
    """With the Triton kernels (interpreter here), verify steps are short-row steps: their GDN layers run
    gdn_rows (the state written after each draft), and greedy output stays plain decoding's."""
    from triton_kernels import gdn_short_rows

    path = tiny_checkpoint("qwen3_5", mtp=True)
    kw = dict(linear_attn_backend="triton")
    params = {**GREEDY, "max_new_tokens": 9}
    plain, _ = _generate(path, PROMPTS[:2], params, **kw)
    truth = {tuple(prompt): o["output_ids"] for prompt, o in zip(PROMPTS, plain)}
    scripted = ScriptedDrafts(truth, 0.7, seed=3)
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))
    calls = [0]
    real = gdn_short_rows.gdn_rows
    monkeypatch.setattr(gdn_short_rows, "gdn_rows", lambda **a: (calls.__setitem__(0, calls[0] + 1), real(**a))[1])
    spec, _ = _generate(path, PROMPTS[:2], params, **kw, **SPEC)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert calls[0] > 0


@pytest.mark.parametrize("overlap", [True, False])
def test_large_decode_batches_run_plain_steps_and_drafting_resumes_below_the_limit(tiny_checkpoint, monkeypatch,
                                                                                   overlap):
    """--speculative-disable-by-batch-size 3: while 3 or 4 requests decode, the steps are plain decode steps
    (overlapped when overlap is on) and take no drafts; once two have finished, the other two verify drafts
    again. Greedy output equals plain decoding throughout, and the pools stay whole."""
    path = tiny_checkpoint("qwen3_5", mtp=True)
    lengths = [6, 9, 24, 30]
    params = [{**GREEDY, "max_new_tokens": n} for n in lengths]
    plain, _ = _generate(path, PROMPTS, params)
    truth = {tuple(prompt): o["output_ids"] for prompt, o in zip(PROMPTS, plain)}
    scripted = ScriptedDrafts(truth, 0.9, seed=3)
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))
    with Engine(model_path=path, **BASE, **SPEC, speculative_disable_by_batch_size=3,
                disable_overlap_schedule=not overlap) as engine:
        spec = engine.generate(input_ids=PROMPTS, sampling_params=params)
        engine.check_integrity()
        pipeline = engine.scheduler.pipeline
        plain_steps, overlapped = pipeline.plain_decode_steps, pipeline.num_overlapped_steps
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert plain_steps == 8  # the second request's 8 decode steps (3 or 4 requests decode in each) ran plain
    assert (overlapped > 0) == overlap
    verify_ct = [o["meta_info"]["spec_verify_ct"] for o in spec]
    assert verify_ct[0] == 0  # it ends while the batch is at the limit
    assert verify_ct[3] > 0 and verify_ct[3] < 30 - plain_steps  # drafts kept after the batch shrank


def test_the_batch_limit_of_speculation_is_checked_at_start(tiny_checkpoint):
    with pytest.raises(ValueError, match="--speculative-disable-by-batch-size must be >= 0"):
        ServerArgs(model_path=tiny_checkpoint("qwen3_5", mtp=True), **BASE, **SPEC,
                   speculative_disable_by_batch_size=-1).resolved()


def test_the_batch_limit_defaults_to_the_measured_one_of_each_path(tiny_checkpoint):
    path = tiny_checkpoint("qwen3_5", mtp=True)
    chained = {**SPEC, "disable_speculative_overlap": False}

    def limit(**kw):
        return ServerArgs(model_path=path, **{**BASE, **kw}).resolved().speculative_disable_by_batch_size

    assert limit(**chained) == 65
    assert limit(**chained, disable_overlap_schedule=True) == limit(**SPEC) == 56
    assert limit(**chained, speculative_disable_by_batch_size=0) == 0


def test_a_batch_filling_up_by_chunked_prefill_decodes_plain_steps_from_its_start(tiny_checkpoint, monkeypatch):
    """Four requests prefilled one chunk at a time, limit 3: the first ones decode while the others still
    prefill or wait, yet they count toward the limit, so no row verifies drafts until two requests have
    finished: the two that finish first never verify drafts at all."""
    path = tiny_checkpoint("qwen3_5", mtp=True)
    params = [{**GREEDY, "max_new_tokens": n} for n in (16, 16, 16, 30)]
    kw = dict(chunked_prefill_size=32)
    prompts = [_ids(10 + i, 30) for i in range(4)]
    plain, _ = _generate(path, prompts, params, **kw)
    truth = {tuple(prompt): o["output_ids"] for prompt, o in zip(prompts, plain)}
    scripted = ScriptedDrafts(truth, 1.0, seed=0)
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))
    with Engine(model_path=path, **BASE, **SPEC, **kw, speculative_disable_by_batch_size=3) as engine:
        spec = engine.generate(input_ids=prompts, sampling_params=params)
        engine.check_integrity()
        plain_steps = engine.scheduler.pipeline.plain_decode_steps
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    verify_ct = [o["meta_info"]["spec_verify_ct"] for o in spec]
    assert verify_ct[0] == verify_ct[1] == 0
    assert plain_steps >= 15 and verify_ct[3] > 0  # the longest one speculates once two have finished
