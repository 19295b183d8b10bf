"""SGLang frontend programs with constraints against the server (random weights, so every output
is only what the grammar allows): gen with regex, choices, dtype int / float / bool / str and
json_schema, select's choice methods, fork / join, run_batch and streaming with constraints; an
image is refused with a clear error."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import sglang as sgl
from sglang.lang.ir import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR

PHONE = r"\(\d{3}\) \d{3}-\d{4}"
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def backend(server):
    backend = sgl.RuntimeEndpoint(server.url)
    sgl.set_default_backend(backend)
    return backend


def matches_or_runs_out(pattern: str, state, name: str) -> bool:
    """The value full-matches, or the tokens ran out while it was still a valid beginning."""
    value, meta = state[name], state.get_meta_info(name)
    if meta["finish_reason"]["type"] == "stop":
        return re.fullmatch(pattern, value) is not None
    return meta["finish_reason"]["type"] == "length"


@sgl.function
def typed(s):
    s += "Phone: " + sgl.gen("phone", regex=PHONE, max_tokens=20, temperature=1.0)
    s += "\nCount: " + sgl.gen("count", dtype=int, max_tokens=6)
    s += "\nRatio: " + sgl.gen("ratio", dtype=float, max_tokens=6)
    s += "\nOk: " + sgl.gen("ok", dtype=bool, max_tokens=8)
    s += "\nWord: " + sgl.gen("word", dtype=str, max_tokens=12)
    s += "\nColour: " + sgl.gen("colour", choices=["red", "green", "blue"])
    s += "\nPerson: " + sgl.gen("person", json_schema=json.dumps(PERSON), max_tokens=80, temperature=0.8)


def test_gen_with_constraints(backend):
    state = typed.run()
    assert re.fullmatch(PHONE, state["phone"])
    for name, pattern in [("count", REGEX_INT), ("ratio", REGEX_FLOAT), ("ok", REGEX_BOOL), ("word", REGEX_STR)]:
        assert matches_or_runs_out(pattern, state, name), (name, state[name])
    int(state["count"])
    assert state["ok"] in ("True", "False")
    assert state["colour"] in ("red", "green", "blue")
    assert state.get_meta_info("person")["finish_reason"]["type"] == "stop"
    jsonschema.validate(json.loads(state["person"]), PERSON)


# (unconditional_likelihood_normalized sends prefill-only requests without logprob_start_len, which
# SGLang's server, and this one, answer with no input logprobs; the frontend then fails on either.)
@pytest.mark.parametrize("method", [sgl.token_length_normalized, sgl.greedy_token_selection])
def test_select_methods(backend, method):
    @sgl.function
    def pick(s):
        s += "The sky is"
        s += sgl.select("colour", choices=[" blue", " green", " a deep shade of red"], choices_method=method)

    state = pick.run()
    assert state["colour"] in (" blue", " green", " a deep shade of red")
    meta = state.get_meta_info("colour")
    assert len(meta["normalized_prompt_logprobs"]) == 3


@sgl.function
def branches(s):
    s += "Codes:"
    forks = s.fork(3)
    for k, fork in enumerate(forks):
        fork += f" #{k} " + sgl.gen("code", regex=r"[A-F0-9]{4}", max_tokens=8, temperature=1.0)
    forks.join()
    s["codes"] = [fork["code"] for fork in forks]


def test_fork_join_and_run_batch(backend):
    state = branches.run()
    assert len(state["codes"]) == 3 and all(re.fullmatch(r"[A-F0-9]{4}", c) for c in state["codes"])
    states = typed.run_batch([{}, {}, {}], progress_bar=False)
    for st in states:
        assert re.fullmatch(PHONE, st["phone"]) and st["colour"] in ("red", "green", "blue")


def test_streaming_with_regex(backend):
    @sgl.function
    def dated(s):
        s += "Date: " + sgl.gen("date", regex=r"20\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d)", max_tokens=16)

    state = dated.run(stream=True)
    pieces = list(state.text_iter())
    assert "".join(pieces) == state.text()
    assert re.fullmatch(r"20\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d)", state["date"])


def test_image_is_refused(backend, tmp_path):
    image = tmp_path / "pixel.png"
    image.write_bytes(bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                                    "1f15c4890000000d49444154789c6360000002000100e5270de40000000049454e44ae426082"))

    @sgl.function
    def describe(s):
        s += sgl.user(sgl.image(str(image)) + "What is this?")
        s += sgl.assistant(sgl.gen("answer", max_tokens=4))

    with pytest.warns(UserWarning, match="image_data is not supported"):  # the frontend warns, then records it
        state = describe.run()
        state.sync()
    assert "image_data is not supported" in str(state.error())
