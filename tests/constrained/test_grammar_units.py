"""The bitmask against a per-token loop, the compile cache (hits, cached failures, the timeout),
error messages that name the field and the cause, and overlapped steps that sample after the host
advanced the matchers."""

from __future__ import annotations

import re
import threading
import time

import pytest
import torch

from hybrid_sgl.constrained import GrammarCache, GrammarError, GrammarKey, grammar_key
from hybrid_sgl.constrained.backend import GrammarBackend
from hybrid_sgl.runner.sampler import apply_token_bitmask


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 400])
def test_apply_token_bitmask_matches_loop(vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(3, vocab, generator=g)
    mask = torch.randint(-(1 << 31), 1 << 31, (3, (vocab + 31) // 32), generator=g, dtype=torch.int64).to(torch.int32)
    out = apply_token_bitmask(logits, mask)
    for r in range(3):
        for t in range(vocab):
            allowed = (int(mask[r, t // 32]) >> (t % 32)) & 1
            assert out[r, t] == (logits[r, t] if allowed else float("-inf"))
    assert torch.equal(apply_token_bitmask(logits, torch.full_like(mask, -1)), logits)


def test_grammar_key_checks():
    assert grammar_key() is None
    assert grammar_key(json_schema="{}") == GrammarKey("json", "{}")
    with pytest.raises(GrammarError, match="at most one of .* got regex, ebnf"):
        grammar_key(regex="a", ebnf="root ::= \"a\"")


class SlowBackend(GrammarBackend):
    vocab_size = 8

    def __init__(self):
        self.release = threading.Event()
        self.calls = 0

    def compile(self, key):
        self.calls += 1
        if key.spec == "bad":
            raise GrammarError("invalid regex: bad")
        self.release.wait(5)
        return key.spec

    def matcher(self, compiled):
        return compiled


def test_cache_compiles_once_and_times_out():
    backend = SlowBackend()
    cache = GrammarCache(backend)
    key = GrammarKey("regex", "a+")
    with pytest.raises(GrammarError, match="took more than 0.05 s to compile; simplify it"):
        cache.matcher(key, timeout=0.05)
    backend.release.set()
    assert cache.matcher(key) == "a+" and cache.matcher(key) == "a+"
    with pytest.raises(GrammarError, match="invalid regex"):
        cache.matcher(GrammarKey("regex", "bad"))
    with pytest.raises(GrammarError, match="invalid regex"):  # the failure is cached too
        cache.matcher(GrammarKey("regex", "bad"))
    assert backend.calls == 2 and cache.hits == 3
    t = time.perf_counter()
    cache.get(key)
    assert time.perf_counter() - t < 1e-3  # attaching a cached grammar
    cache.shutdown()


@pytest.mark.parametrize("params, message", [
    ({"regex": "[a-"}, "invalid regex: Regex parsing error"),
    ({"json_schema": "{not json"}, "json_schema is not valid JSON"),
    ({"json_schema": '{"type": "frobnicate"}'}, "invalid json_schema: .*frobnicate"),
    ({"ebnf": "root ::= undefined_rule"}, "invalid ebnf: .*undefined_rule"),
])
def test_invalid_grammar_finishes_with_400(engine, params, message):
    out = engine.generate("Hi", {**params, "max_new_tokens": 4})
    reason = out["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and reason["status_code"] == 400
    assert re.search(message, reason["message"]), reason["message"]


def test_invalid_stop_regex_and_two_grammars_are_refused(engine):
    with pytest.raises(ValueError, match="stop_regex '\\(' is not a valid regular expression"):
        engine.generate("Hi", {"stop_regex": "("})
    with pytest.raises(ValueError, match="at most one of"):
        engine.generate("Hi", {"regex": "a", "json_schema": "{}"})


def test_stop_regex_stops(engine):
    out = engine.generate("Hi", {"regex": "[a-c]{3}[0-9]{5}", "stop_regex": "[0-9]{2}", "max_new_tokens": 12,
                                 "temperature": 1.0, "sampling_seed": 1})
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    matched = out["meta_info"]["finish_reason"]["matched"]
    assert re.fullmatch("[0-9]{2}", matched)
    assert re.fullmatch("[a-c]{3}", out["text"])  # trimmed at the match, as SGLang trims stop strings


def test_overlapped_constrained_steps(engine):
    """Under overlap, constrained decode steps are still pipelined (sampled after the host applied the
    previous step), and the output is the same as a batch of one."""
    if engine.server_args.disable_overlap_schedule:
        pytest.skip("overlap only")
    before = engine.scheduler.num_overlapped_steps
    params = {"regex": "(ab|cd){4,6}x", "max_new_tokens": 20, "temperature": 0}
    alone = engine.generate("Go:", params)
    assert engine.scheduler.num_overlapped_steps > before
    both = engine.generate(["Go:", "Other"], [params, {"max_new_tokens": 10, "temperature": 0}])
    assert both[0]["output_ids"] == alone["output_ids"]


def test_json_strings_never_hold_raw_control_characters(engine):
    import xgrammar as xgr

    backend = engine.scheduler.grammars.backend
    for schema in ('{"type": "string", "maxLength": 4}', '{"type": "string"}'):
        compiled = backend.compile(GrammarKey("json", schema))
        assert not xgr.GrammarMatcher(compiled).accept_string('"a\x17')
        assert xgr.GrammarMatcher(compiled).accept_string('"ab"')


def test_overlap_gives_the_tokens_of_the_plain_scheduler(tiny_checkpoint):
    """Seeded sampling through a mixed batch (regex, JSON, free; staggered lengths): the overlapped
    engine, whose constrained steps sample after the host advanced the matchers, emits exactly the
    tokens of the synchronous one."""
    from hybrid_sgl import Engine

    params = [{"regex": "(ab|cd){2,9}!", "max_new_tokens": 24}, {"json_schema": '{"type": "array", "maxItems": 3}',
                                                                 "max_new_tokens": 40},
              {"max_new_tokens": 7, "ignore_eos": True}, {"regex": "[0-9]{1,12}", "max_new_tokens": 5}]
    params = [{**p, "temperature": 1.0, "sampling_seed": 100 + i} for i, p in enumerate(params)]
    prompts = ["Hello", "JSON:", "Once upon a time", "Digits"]
    runs = []
    for overlap in (True, False):
        eng = Engine(model_path=tiny_checkpoint("qwen3_5"), dtype="float32", device="cpu", log_level="warning",
                     disable_overlap_schedule=not overlap, max_running_requests=8)
        runs.append([o["output_ids"] for o in eng.generate(prompts, params)])
        if overlap:
            assert eng.scheduler.num_overlapped_steps > 0
        eng.shutdown()
    assert runs[0] == runs[1]


def test_grammar_backend_none_refuses_constraints(tiny_checkpoint):
    from hybrid_sgl import Engine

    eng = Engine(model_path=tiny_checkpoint("qwen3_5"), dtype="float32", device="cpu", log_level="warning",
                 grammar_backend="none")
    try:
        assert eng.scheduler.grammars is None
        reason = eng.generate("Hi", {"regex": "a+", "max_new_tokens": 3})["meta_info"]["finish_reason"]
        assert reason["status_code"] == 400 and "--grammar-backend none" in reason["message"]
        assert eng.generate("Hi", {"max_new_tokens": 3, "ignore_eos": True})["meta_info"]["completion_tokens"] == 3
    finally:
        eng.shutdown()
