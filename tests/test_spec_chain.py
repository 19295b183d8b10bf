"""Chained speculative iterations (the default; --disable-speculative-overlap: off) on CPU, float32: greedy
output equals plain decoding, with the MTP layer's drafts and with scripted ones accepted at a set rate,
alone, batched, with mixed lengths, stop tokens and max_new_tokens ending rows inside an iteration, and
beside requests that do not chain; iterations really run behind each other; the pools stay whole.

The scripted drafts (test-only) replace the device's proposals by the true continuation with probability p per
token (a wrong token otherwise), looked up by slot and position from a plain run."""

import random

import pytest
import torch

from hybrid_sgl.engine import Engine
from hybrid_sgl.runner.spec_chain import SpecChain
from tests.test_speculative import BASE, FAMILIES, GREEDY, PROMPTS, SHARED_PREFIX_PROMPTS, SPEC, TIGHT

CHAIN = {**SPEC, "disable_speculative_overlap": False}  # the default


def _run(path: str, prompts, params, **kw):
    with Engine(model_path=path, **{**BASE, **kw}) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        engine.check_integrity()
        stats = {**engine.stats(), "overlapped": engine.scheduler.num_overlapped_steps}
    return outs, stats


class ScriptedChainDrafts:
    """Test-only SpecChain._propose: the token at each draft's position in the plain run's sequence of the
    request in that slot, kept with probability p, else a wrong one."""

    def __init__(self, truth: dict[tuple, list[int]], p: float, seed: int):
        self.truth, self.p, self.rng = truth, p, random.Random(seed)
        self.by_slot: dict[int, list[int]] = {}

    def launch(self, original):
        def launch(chain, items, *args, **kw):
            for it in items:
                prompt = tuple(it.req.prompt_ids)
                self.by_slot[it.req.slot] = list(prompt) + self.truth[prompt] + [5] * 16
            return original(chain, items, *args, **kw)
        return launch

    def propose(self, chain, h, slots, m):
        positions = (chain.slot_lens[slots] + m).tolist()
        out = []
        for slot, q in zip(slots.tolist(), positions):
            if slot not in self.by_slot:  # a pad row
                out.append(0)
                continue
            t = self.by_slot[slot][q]
            out.append(t if self.rng.random() < self.p else (t + 1) % 300 + 3)
        return torch.tensor(out, dtype=torch.int64, device=h.device)


def _script(monkeypatch, truth, p, seed=0):
    scripted = ScriptedChainDrafts(truth, p, seed)
    monkeypatch.setattr(SpecChain, "launch", scripted.launch(SpecChain.launch))
    monkeypatch.setattr(SpecChain, "_propose", lambda self, h, slots, m: scripted.propose(self, h, slots, m))


@pytest.mark.parametrize("family", FAMILIES)
def test_chained_greedy_output_equals_plain_decoding_with_the_mtp_drafts(tiny_checkpoint, family):
    path = tiny_checkpoint(family, mtp=True)
    plain, _ = _run(path, PROMPTS, GREEDY)
    chained, stats = _run(path, PROMPTS, GREEDY, **CHAIN)
    assert [o["output_ids"] for o in chained] == [o["output_ids"] for o in plain]
    assert stats["overlapped"] > 0  # iterations were launched behind others
    assert all(o["meta_info"]["spec_verify_ct"] > 0 for o in chained)


@pytest.mark.parametrize("p", [0.5, 0.9, 1.0])
def test_accepted_drafts_and_rollback_keep_chained_output_exact(tiny_checkpoint, monkeypatch, p):
    path = tiny_checkpoint("qwen3_5", mtp=True)
    params = [{**GREEDY, "max_new_tokens": n} for n in (23, 9, 31, 17)]  # rows end inside iterations
    plain, _ = _run(path, PROMPTS, params)
    _script(monkeypatch, {tuple(q): o["output_ids"] for q, o in zip(PROMPTS, plain)}, p, seed=int(p * 10))
    chained, stats = _run(path, PROMPTS, params, **CHAIN)
    assert [o["output_ids"] for o in chained] == [o["output_ids"] for o in plain]
    assert [len(o["output_ids"]) for o in chained] == [23, 9, 31, 17]  # max_new_tokens is never overshot
    assert sum(o["meta_info"]["spec_verify_ct"] for o in chained) < sum(len(o["output_ids"]) for o in chained)
    assert stats["avg_spec_accept_length"] > (2.0 if p >= 0.9 else 1.2)
    assert stats["overlapped"] > 0


def test_a_stop_token_ends_a_chained_row_where_plain_decoding_ends(tiny_checkpoint, monkeypatch):
    path = tiny_checkpoint("qwen3_5", mtp=True)
    plain, _ = _run(path, PROMPTS, GREEDY)
    stop = plain[1]["output_ids"][6]
    params = {**GREEDY, "stop_token_ids": [stop]}
    plain, _ = _run(path, PROMPTS, params)
    _script(monkeypatch, {tuple(q): o["output_ids"] + [7] * 20 for q, o in zip(PROMPTS, plain)}, 1.0)
    chained, _ = _run(path, PROMPTS, params, **CHAIN)
    assert [o["output_ids"] for o in chained] == [o["output_ids"] for o in plain]
    assert [o["meta_info"]["finish_reason"] for o in chained] == [o["meta_info"]["finish_reason"] for o in plain]


def test_requests_that_do_not_chain_verify_beside_chained_ones(tiny_checkpoint, monkeypatch):
    """A logprob request in the batch keeps every verify step on the host path; once it ends, the rest chain."""
    path = tiny_checkpoint("qwen3_5", mtp=True)
    params = [{**GREEDY, "max_new_tokens": n} for n in (30, 6, 30, 30)]
    plain, _ = _run(path, PROMPTS, params)
    _script(monkeypatch, {tuple(q): o["output_ids"] for q, o in zip(PROMPTS, plain)}, 0.8)
    with Engine(model_path=path, **BASE, **CHAIN) as engine:
        outs = [engine.async_generate(input_ids=q, sampling_params=s, return_logprob=(i == 1))
                for i, (q, s) in enumerate(zip(PROMPTS, params))]
        import asyncio

        async def gather():
            return await asyncio.gather(*outs)
        chained = asyncio.run(gather())
        engine.check_integrity()
        overlapped = engine.scheduler.num_overlapped_steps
    assert [o["output_ids"] for o in chained] == [o["output_ids"] for o in plain]
    assert overlapped > 0


@pytest.mark.parametrize("token_map", [False, True])
def test_chained_drafts_equal_the_host_paths_drafts(tiny_checkpoint, monkeypatch, tmp_path, token_map):
    """The device's drafting (the MTP layer over every verify position, then the chained passes at positions
    from slot_lens) proposes what the host path's drafting proposes from the same request state; also with
    --speculative-token-map (the drafts among every other id)."""
    import json

    from hybrid_sgl.runner.spec_chain import PendingChain
    from hybrid_sgl.runner.speculative import SpecDecoder
    from hybrid_sgl.scheduler.speculative import SpecPipeline

    path = tiny_checkpoint("qwen3_5", mtp=True)
    kw = {}
    if token_map:
        (tmp_path / "map.json").write_text(json.dumps(list(range(0, 300, 2))))
        kw["speculative_token_map"] = str(tmp_path / "map.json")
    host_drafts, chain_drafts = {}, {}
    draft = SpecDecoder.draft

    def recording_draft(self, entries):
        out = draft(self, entries)
        host_drafts.update({(tuple(e.req.prompt_ids), e.req.num_computed): d for e, d in zip(entries, out) if e.want})
        return out

    monkeypatch.setattr(SpecDecoder, "draft", recording_draft)
    _run(path, PROMPTS, GREEDY, **SPEC, **kw)
    results, resolve = PendingChain.results, SpecPipeline._resolve_chain

    def keeping_results(self):
        self.kept_results = results(self)
        return self.kept_results

    def recording_resolve(self, pending):
        changed = resolve(self, pending)
        chain_drafts.update({(tuple(it.req.prompt_ids), it.req.num_computed): d for it, (_, d) in zip(pending.items,
                             pending.kept_results) if not it.req.finished})
        return changed

    monkeypatch.setattr(PendingChain, "results", keeping_results)
    monkeypatch.setattr(SpecPipeline, "_resolve_chain", recording_resolve)
    _run(path, PROMPTS, GREEDY, **CHAIN, **kw)
    common = host_drafts.keys() & chain_drafts.keys()
    assert len(common) > 20
    assert not token_map or all(d % 2 == 0 for key in common for d in chain_drafts[key])
    # (the host path proposes fewer near max_new_tokens; the device always proposes k)
    assert {key: chain_drafts[key][:len(host_drafts[key])] for key in common} == {key: host_drafts[key]
                                                                                  for key in common}


def test_rows_ending_by_a_stop_token_inside_an_iteration_cache_their_own_state(tiny_checkpoint, monkeypatch):
    """A stop token ends a row on the device: the iteration behind (launched before the host saw the stop) runs
    it as a pad row, so the state the prefix cache gets after it is the one after the request's own tokens."""
    path = tiny_checkpoint("qwen3_5", mtp=True)
    first, _ = _run(path, PROMPTS, GREEDY)
    stops = [o["output_ids"][n] for o, n in zip(first, (7, 4, 10, 5))]  # each prompt's own stop, mid-way
    params = [{**GREEDY, "stop_token_ids": [t]} for t in stops]
    plain = _two_turns(path, params)
    assert all(o["meta_info"]["finish_reason"]["type"] == "stop" for o in plain[0])
    truth = {tuple(q): o["output_ids"] + [7] * 20 for q, o in zip(PROMPTS, plain[0])}
    truth.update({tuple(q + o["output_ids"] + [9, 10]): o2["output_ids"] for q, o, o2 in zip(PROMPTS, *plain)})
    _script(monkeypatch, truth, 1.0)
    chained = _two_turns(path, params, **CHAIN)
    assert [o["output_ids"] for o in chained[0]] == [o["output_ids"] for o in plain[0]]
    assert [o["output_ids"] for o in chained[1]] == [o["output_ids"] for o in plain[1]]
    assert all(o["meta_info"]["cached_tokens"] > len(q) for q, o in zip(PROMPTS, chained[1]))


def _two_turns(path: str, params, **kw):
    """PROMPTS, then each prompt + its output + two tokens (from the prefix cache), in one engine."""
    with Engine(model_path=path, **{**BASE, **kw}) as engine:
        first = engine.generate(input_ids=PROMPTS, sampling_params=params)
        second = engine.generate(input_ids=[q + o["output_ids"] + [9, 10] for q, o in zip(PROMPTS, first)],
                                 sampling_params=GREEDY)
        engine.check_integrity()
    return first, second


def test_a_row_that_ends_inside_an_iteration_caches_the_state_of_its_own_tokens(tiny_checkpoint, monkeypatch):
    """The device keeps all k + 1 tokens of a row whose request ends at the first of them (max_new_tokens); the
    state that goes into the prefix cache is the one after the request's own tokens, so the next turn, which
    starts from it, decodes as it does without drafts."""
    path = tiny_checkpoint("qwen3_5", mtp=True)
    params = [{**GREEDY, "max_new_tokens": n} for n in (10, 7, 13, 8)]
    plain = _two_turns(path, params)
    truth = {tuple(q): o["output_ids"] for q, o in zip(PROMPTS, plain[0])}
    truth.update({tuple(q + o["output_ids"] + [9, 10]): o2["output_ids"] for q, o, o2 in zip(PROMPTS, *plain)})
    _script(monkeypatch, truth, 1.0)
    chained = _two_turns(path, params, **CHAIN)
    assert [o["output_ids"] for o in chained[0]] == [o["output_ids"] for o in plain[0]]
    assert [o["output_ids"] for o in chained[1]] == [o["output_ids"] for o in plain[1]]
    assert all(o["meta_info"]["cached_tokens"] > len(q) for q, o in zip(PROMPTS, chained[1]))  # (all end by length)


def test_iterations_padded_to_a_larger_row_count_are_exact(tiny_checkpoint, monkeypatch):
    """As a captured graph runs them: the rows padded with pad rows (pad slot, no KV, no state, no length)."""
    path = tiny_checkpoint("qwen3_5", mtp=True)
    params = [{**GREEDY, "max_new_tokens": n} for n in (23, 9, 31, 17)]
    plain, _ = _run(path, PROMPTS, params)
    _script(monkeypatch, {tuple(q): o["output_ids"] for q, o in zip(PROMPTS, plain)}, 0.7)
    monkeypatch.setattr(SpecChain, "_rows_for", lambda self, b: b + 3)
    chained, stats = _run(path, PROMPTS, params, **CHAIN)
    assert [o["output_ids"] for o in chained] == [o["output_ids"] for o in plain]
    assert stats["overlapped"] > 0


def test_prefix_cache_hits_and_preemption_keep_chained_output_exact(tiny_checkpoint, monkeypatch):
    """Pages for the iteration behind the one in flight come from the free pool or evicted prefixes; when they
    cannot, the run of iterations ends and the scheduler preempts as usual."""
    path = tiny_checkpoint("qwen3_5", mtp=True)
    prompts, tight = SHARED_PREFIX_PROMPTS, TIGHT
    plain, _ = _run(path, prompts, GREEDY, **tight)
    truth = {tuple(q): o["output_ids"] for q, o in zip(prompts, plain)}
    truth[tuple(prompts[0][:60])] = _run(path, [prompts[0][:60]], GREEDY)[0][0]["output_ids"]
    _script(monkeypatch, truth, 0.7, seed=2)
    with Engine(model_path=path, **BASE, **tight, **CHAIN) as engine:
        first = engine.generate(input_ids=prompts, sampling_params=GREEDY)
        again = engine.generate(input_ids=prompts[0][:60], sampling_params=GREEDY)
        preemptions = engine.run_on_engine(lambda s: s.num_preemptions)
        overlapped = engine.scheduler.num_overlapped_steps
        engine.check_integrity()
    assert [o["output_ids"] for o in first] == [o["output_ids"] for o in plain]
    assert preemptions > 0 and overlapped > 0
    assert again["meta_info"]["cached_tokens"] >= 48
    assert again["output_ids"] == truth[tuple(prompts[0][:60])]


def test_chained_iterations_resume_below_the_batch_limit(tiny_checkpoint, monkeypatch):
    """--speculative-disable-by-batch-size 3: plain overlapped decode steps while 3 or 4 requests decode, chained
    iterations once two have finished; greedy output equals plain decoding throughout."""
    path = tiny_checkpoint("qwen3_5", mtp=True)
    params = [{**GREEDY, "max_new_tokens": n} for n in (6, 9, 24, 30)]
    plain, _ = _run(path, PROMPTS, params)
    _script(monkeypatch, {tuple(q): o["output_ids"] for q, o in zip(PROMPTS, plain)}, 0.9, seed=3)
    launches = []
    launch = SpecChain.launch
    monkeypatch.setattr(SpecChain, "launch", lambda self, items, *a, **k: (launches.append(len(items)),
                                                                          launch(self, items, *a, **k))[1])
    with Engine(model_path=path, **BASE, **CHAIN, speculative_disable_by_batch_size=3) as engine:
        chained = engine.generate(input_ids=PROMPTS, sampling_params=params)
        engine.check_integrity()
        plain_steps = engine.scheduler.pipeline.plain_decode_steps
    assert [o["output_ids"] for o in chained] == [o["output_ids"] for o in plain]
    assert plain_steps == 8 and launches and max(launches) <= 2


def test_abort_while_a_chained_iteration_is_in_flight(tiny_checkpoint, monkeypatch):
    from hybrid_sgl.sampling_params import SamplingParams
    from hybrid_sgl.scheduler.request import Req
    from tests.test_hf_parity import make_scheduler

    path = tiny_checkpoint("qwen3_5", mtp=True)
    s = make_scheduler(path, **CHAIN)
    reqs = [Req(rid=f"r{i}", prompt_ids=q, params=SamplingParams(max_new_tokens=30, temperature=0, ignore_eos=True))
            for i, q in enumerate(PROMPTS)]
    for req in reqs:
        s.add(req)
    steps, aborted = 0, False
    while s.has_work:
        if not aborted and s.pipeline.in_flight is not None and s.num_overlapped_steps >= 2:
            s.abort("r1")
            aborted = True
        s.step()
        s.allocator.check_integrity()
        s.check_integrity()
        steps += 1
        assert steps < 300
    assert aborted and reqs[1].finish_reason["type"] == "abort"
    assert all(len(r.output_ids) == 30 for i, r in enumerate(reqs) if i != 1)
    assert s.allocator.num_free_slots == s.allocator.num_slots


def test_batched_speculative_sampling_keeps_the_models_distribution():
    """speculative_sample_rows over 40,000 rows in one call: a row's first token has p0 whatever its draft, and
    its second, given that the first draft was kept, has p1 (chi-square)."""
    from hybrid_sgl.runner.verify_scoring import speculative_sample_rows
    from tests.test_sampler_exact import chi_square_p

    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(3, 6, generator=gen) * 1.5, dim=-1)
    probs[1, 4] = 0.0  # a token top-k / top-p removed
    probs[1] /= probs[1].sum()
    n = 40_000
    for draft in ([2, 4], [5, 1]):
        acc, last = speculative_sample_rows(probs.expand(n, 3, 6), torch.tensor([draft]).expand(n, 2), gen)
        first = torch.where(acc > 0, draft[0], last)
        second = torch.where(acc > 1, draft[1], last)[acc > 0]
        assert chi_square_p(torch.bincount(first, minlength=6).float(), probs[0]) > 1e-3, draft
        assert chi_square_p(torch.bincount(second, minlength=6).float(), probs[1]) > 1e-3, draft


def test_sampled_rows_chain_and_a_near_zero_temperature_decodes_as_greedy(tiny_checkpoint, monkeypatch):
    """Rows with temperature 1e-4 are sampled rows (speculative sampling on the device, the graphs' sampled
    variant), whose distributions are all but one-hot: the output equals greedy plain decoding, beside greedy
    rows in the same iterations."""
    path = tiny_checkpoint("qwen3_5", mtp=True)
    plain, _ = _run(path, PROMPTS, GREEDY)
    _script(monkeypatch, {tuple(q): o["output_ids"] for q, o in zip(PROMPTS, plain)}, 0.7, seed=4)
    sampled_launches = []
    iterate = SpecChain._iterate
    monkeypatch.setattr(SpecChain, "_iterate", lambda self, rows, sampled=False: (sampled_launches.append(sampled),
                                                                                  iterate(self, rows, sampled))[1])
    params = [{**GREEDY, "temperature": 1e-4} if i % 2 else GREEDY for i in range(len(PROMPTS))]
    chained, stats = _run(path, PROMPTS, params, **CHAIN)
    assert [o["output_ids"] for o in chained] == [o["output_ids"] for o in plain]
    assert any(sampled_launches) and stats["overlapped"] > 0
    assert stats["avg_spec_accept_length"] > 1.5


def test_a_sampled_rows_tokens_come_from_speculative_sampling(tiny_checkpoint, monkeypatch):
    """Wiring: with speculative_sample_rows stubbed to reject every draft and draw token 7, a sampled row's output
    is all 7s and the greedy rows beside it still decode as plain greedy decoding."""
    import hybrid_sgl.runner.spec_chain as spec_chain

    path = tiny_checkpoint("qwen3_5", mtp=True)
    plain, _ = _run(path, PROMPTS, GREEDY)
    monkeypatch.setattr(spec_chain, "speculative_sample_rows", lambda probs, drafts: (
        torch.zeros(probs.shape[0], dtype=torch.int64), torch.full((probs.shape[0],), 7)))
    params = [{**GREEDY, "temperature": 0.8} if i == 1 else GREEDY for i in range(len(PROMPTS))]
    with Engine(model_path=path, **BASE, **CHAIN) as engine:
        chained = engine.generate(input_ids=PROMPTS, sampling_params=params)
        overlapped = engine.scheduler.num_overlapped_steps
    assert overlapped > 0
    assert [o["output_ids"] for i, o in enumerate(chained) if i != 1] == [o["output_ids"] for i, o in
                                                                           enumerate(plain) if i != 1]
    # the chained iterations' tokens (the first come from the prefill and a host-path verify step, the last from
    # host-path steps as the request nears max_new_tokens, which sample as usual)
    assert chained[1]["output_ids"].count(7) >= 8 > plain[1]["output_ids"].count(7)


@pytest.mark.parametrize("family,p", [("qwen3_5", 0.6), ("qwen3_next", 0.9)])
def test_chained_iterations_with_the_replayed_rollback_are_exact(tiny_checkpoint, monkeypatch, family, p):
    """--speculative-rollback replay inside the iteration: the verify writes no gated-delta-rule state, the kept
    tokens run again from the untouched slots, the conv states take their draft rows (GDN layers that remember,
    so that a wrong state shows in the tokens); rows end inside iterations by length."""
    path = tiny_checkpoint(family, mtp=True)
    params = [{**GREEDY, "max_new_tokens": n} for n in (23, 9, 31, 17)]
    plain, _ = _run(path, PROMPTS, params)
    _script(monkeypatch, {tuple(q): o["output_ids"] for q, o in zip(PROMPTS, plain)}, p, seed=5)
    chained, stats = _run(path, PROMPTS, params, **CHAIN, speculative_rollback="replay")
    assert [o["output_ids"] for o in chained] == [o["output_ids"] for o in plain]
    assert stats["overlapped"] > 0 and stats["avg_spec_accept_length"] > 1.5
