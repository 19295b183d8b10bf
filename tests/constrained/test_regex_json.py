"""Regexes and JSON schemas drawn by hypothesis, decoded with random weights at temperature 1: every
output full-matches its regex / parses and validates, and finishes with "stop" within the bound
the grammar implies. Batches mix constrained and free requests, n > 1 and streaming."""

from __future__ import annotations

import json
import math
import re

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
LITERALS = "abcxyz019 _-"


# ---- regexes: (pattern, longest match in characters) ---------------------------------------------
def _leaf():
    literal = st.sampled_from(LITERALS).map(lambda c: (re.escape(c), 1))
    klass = st.sampled_from(["[a-c]", "[0-9]", "[xyz_]", "\\d"]).map(lambda k: (k, 1))
    return literal | klass


def _extend(inner):
    concat = st.lists(inner, min_size=2, max_size=3).map(lambda xs: ("".join(p for p, _ in xs), sum(n for _, n in xs)))
    alt = st.lists(inner, min_size=2, max_size=3).map(
        lambda xs: ("(" + "|".join(p for p, _ in xs) + ")", max(n for _, n in xs)))
    rep = st.tuples(inner, st.integers(0, 2), st.integers(0, 3)).map(
        lambda t: (f"({t[0][0]}){{{t[1]},{t[1] + t[2]}}}", t[0][1] * (t[1] + t[2])))
    opt = inner.map(lambda x: (f"({x[0]})?", x[1]))
    return concat | alt | rep | opt


REGEXES = st.recursive(_leaf(), _extend, max_leaves=6)


@SETTINGS
@given(st.lists(REGEXES, min_size=1, max_size=3), st.integers(0, 1 << 30))
def test_regex_outputs_full_match(engine, regexes, seed):
    prompts = ["Hello", "The capital of France is", "def add(a, b):"]
    params = [{"regex": p, "max_new_tokens": n + 2, "temperature": 1.0, "sampling_seed": seed + i, "n": 2}
              for i, (p, n) in enumerate(regexes)]
    params.append({"max_new_tokens": 5, "temperature": 1.0, "ignore_eos": True})  # a free request alongside
    outs = engine.generate(prompts[:len(regexes)] + ["Once upon"], params)
    for k, (pattern, _) in enumerate(regexes):
        for out in outs[2 * k:2 * k + 2]:
            assert out["meta_info"]["finish_reason"]["type"] == "stop", (pattern, out)
            assert re.fullmatch(pattern, out["text"]), (pattern, out["text"])
    assert outs[-1]["meta_info"]["finish_reason"]["type"] == "length"


# ---- JSON schemas --------------------------------------------------------------------------------
SCALARS = st.sampled_from([
    {"type": "integer", "minimum": -50, "maximum": 999},
    {"type": "boolean"},
    {"type": "null"},
    {"type": "string", "maxLength": 6},
    {"type": "string", "enum": ["red", "green", "blue"]},
    {"type": "string", "pattern": "^[a-z]{1,4}$"},
])


def _schemas(inner):
    props = st.dictionaries(st.sampled_from(["a", "b", "name", "x_1", "id"]), inner, min_size=1, max_size=3)
    obj = props.map(lambda p: {"type": "object", "properties": p, "required": sorted(p),
                               "additionalProperties": False})
    arr = inner.map(lambda s: {"type": "array", "items": s, "minItems": 1, "maxItems": 3})
    return obj | arr


SCHEMAS = st.recursive(SCALARS, _schemas, max_leaves=5).filter(lambda s: s.get("type") in ("object", "array"))


@SETTINGS
@given(SCHEMAS, st.integers(0, 1 << 30))
def test_json_schema_outputs_validate(engine, schema, seed):
    params = {"json_schema": json.dumps(schema), "max_new_tokens": 400, "temperature": 1.0, "sampling_seed": seed,
              "n": 2}
    for out in engine.generate("Reply in JSON:", params):
        assert out["meta_info"]["finish_reason"]["type"] == "stop", (schema, out)
        jsonschema.validate(json.loads(out["text"]), schema)


def test_json_object_any(engine):
    out = engine.generate("JSON:", {"json_schema": "$$ANY$$", "max_new_tokens": 300, "temperature": 0.8,
                                    "sampling_seed": 3})
    if out["meta_info"]["finish_reason"]["type"] == "stop":
        json.loads(out["text"])
    else:  # an unbounded grammar may run out of tokens; what came out is still a JSON prefix
        assert out["text"].lstrip()[:1] in "{[\"-0123456789tfn"


def test_streaming_regex(engine):
    pattern = r"(alpha|beta)-[0-9]{2,4}"
    chunks = list(engine.generate("Stream:", {"regex": pattern, "max_new_tokens": 16, "temperature": 1.0,
                                              "sampling_seed": 11}, stream=True))
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # cumulative
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "stop"
    assert re.fullmatch(pattern, texts[-1])


def test_logprobs_and_penalties_with_grammar(engine):
    out = engine.generate("Numbers:", {"regex": "[0-9]{3}", "max_new_tokens": 8, "temperature": 1.0,
                                       "frequency_penalty": 1.5, "repetition_penalty": 1.3, "sampling_seed": 5},
                          return_logprob=True, top_logprobs_num=2)
    assert re.fullmatch("[0-9]{3}", out["text"])
    lps = out["meta_info"]["output_token_logprobs"]
    assert len(lps) == out["meta_info"]["completion_tokens"] and all(lp[0] <= 0 for lp in lps)


def test_logprobs_with_grammar_are_of_the_masked_distribution(engine):
    """Every allowed token of every step, as top logprobs (fewer than asked for: the forbidden ones have
    none): they sum to 1, and only tokens the regex allows appear (digits; at the end, where the regex is
    complete, only the stop tokens)."""
    tok = engine.tokenizer
    stops = set(tok.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    out = engine.generate("Numbers:", {"regex": "[0-9]{3}", "max_new_tokens": 8, "temperature": 1.0,
                                       "sampling_seed": 3}, return_logprob=True, top_logprobs_num=100,
                          return_text_in_logprobs=True)
    assert re.fullmatch("[0-9]{3}", out["text"])
    meta = out["meta_info"]
    positions = list(zip(meta["output_token_logprobs"], meta["output_top_logprobs"]))
    assert len(positions) == meta["completion_tokens"] >= 2
    for k, ((lp, token, _), tops) in enumerate(positions):
        assert len(tops) < 100
        assert math.isclose(sum(math.exp(v) for v, _, _ in tops), 1.0, rel_tol=1e-4), (k, tops)
        assert all(math.isfinite(v) for v, _, _ in tops)
        assert lp == next(v for v, i, _ in tops if i == token)
        if k == len(positions) - 1 and token in stops:
            assert {i for _, i, _ in tops} <= stops
        else:
            assert all(re.fullmatch("[0-9]{1,3}", text) for _, _, text in tops), (k, tops)
    assert len(positions[0][1]) >= 10  # the ten digits at least: a real distribution, not one token
