"""Structured outputs over HTTP against the shared tiny server (random weights): /generate with
regex / json_schema / ebnf (plain and streamed), OpenAI response_format and SGLang's regex / ebnf /
stop_regex extra fields, logprobs under a grammar (of the masked distribution: only allowed tokens),
and a 400 naming the problem for a grammar that does not compile."""

from __future__ import annotations

import json
import math
import re

import httpx
import jsonschema
import openai
import pytest

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
CHAT = [{"role": "user", "content": "Describe a person as JSON."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def generate(url: str, **body) -> httpx.Response:
    return httpx.post(url + "/generate", json=body, timeout=120)


def test_generate_regex_json_ebnf(url):
    sp = {"max_new_tokens": 64, "temperature": 1.0, "n": 2}
    outs = generate(url, text="Phone:", sampling_params={**sp, "regex": r"\(\d{3}\) \d{3}-\d{4}"}).json()
    assert all(re.fullmatch(r"\(\d{3}\) \d{3}-\d{4}", o["text"]) for o in outs)
    outs = generate(url, text="JSON:", sampling_params={**sp, "max_new_tokens": 200,
                                                         "json_schema": json.dumps(SCHEMA)}).json()
    for o in outs:
        assert o["meta_info"]["finish_reason"]["type"] == "stop"
        jsonschema.validate(json.loads(o["text"]), SCHEMA)
    ebnf = 'root ::= "The answer is " ("yes" | "no") "."'
    outs = generate(url, text="Q:", sampling_params={**sp, "ebnf": ebnf}).json()
    assert all(o["text"] in ("The answer is yes.", "The answer is no.") for o in outs)


def test_generate_stream_with_regex(url):
    body = {"text": "Date:", "stream": True,
            "sampling_params": {"regex": r"20\d\d-(0[1-9]|1[0-2])-[0-2]\d", "max_new_tokens": 20, "temperature": 1}}
    with httpx.stream("POST", url + "/generate", json=body, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert re.fullmatch(r"20\d\d-(0[1-9]|1[0-2])-[0-2]\d", events[-1]["text"])
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "stop"


@pytest.mark.parametrize("sp, cause", [
    ({"regex": "(unclosed"}, "invalid regex"),
    ({"json_schema": "{not json"}, "json_schema is not valid JSON"),
    ({"ebnf": "root ::= missing_rule"}, "invalid ebnf"),
    ({"regex": "a", "ebnf": 'root ::= "a"'}, "at most one of regex"),
])
def test_bad_grammar_is_a_400(url, sp, cause):
    for stream in (False, True):
        r = generate(url, text="x", sampling_params=sp, stream=stream)
        assert r.status_code == 400, r.text
        assert cause in r.json()["error"]["message"]


def test_chat_response_format(client, server):
    model = server.model_path
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=200, n=2, response_format={
        "type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}})
    for choice in r.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=300, temperature=0.7,
                                       response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")
    stream = client.chat.completions.create(model=model, messages=CHAT, max_tokens=200, stream=True,
                                            response_format={"type": "json_schema",
                                                             "json_schema": {"name": "p", "schema": SCHEMA}})
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_completions_regex_and_ebnf_extra_body(client, server):
    r = client.completions.create(model=server.model_path, prompt="Colour:", max_tokens=10,
                                  extra_body={"regex": "(red|green|blue)!"})
    assert r.choices[0].text in ("red!", "green!", "blue!")
    r = client.chat.completions.create(model=server.model_path, messages=CHAT, max_tokens=10,
                                       extra_body={"ebnf": 'root ::= [0-9] [0-9] "%"'})
    assert re.fullmatch(r"\d\d%", r.choices[0].message.content)


def test_bad_response_format_is_a_400(client, server):
    with pytest.raises(openai.BadRequestError, match="invalid json_schema"):
        client.chat.completions.create(model=server.model_path, messages=CHAT, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}})
    with pytest.raises(openai.BadRequestError, match="response_format type 'yaml' is not supported"):
        client.chat.completions.create(model=server.model_path, messages=CHAT, response_format={"type": "yaml"})


def test_logprob_lengths_in_meta_info(url):
    body = {"text": "Count:", "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"regex": "[0-9]{6}", "max_new_tokens": 10}}
    meta = generate(url, **body).json()["meta_info"]
    assert meta["output_token_logprobs_length"] == len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    assert meta["input_token_logprobs_length"] == len(meta["input_token_logprobs"]) == meta["prompt_tokens"]
    with httpx.stream("POST", url + "/generate", json={**body, "stream": True}, timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    lengths = [e["meta_info"]["output_token_logprobs_length"] for e in events]
    assert lengths == sorted(lengths) and lengths[-1] == events[-1]["meta_info"]["completion_tokens"]
    placed = sum(len(e["meta_info"]["output_token_logprobs"]) for e in events)  # each chunk brings its new ones
    assert placed == lengths[-1]


def test_token_ids_logprob(url, tokenizer):
    body = {"text": "The capital of France", "return_logprob": True, "logprob_start_len": 0,
            "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    first = generate(url, **body).json()
    seq = [t[1] for t in first["meta_info"]["input_token_logprobs"]] + first["output_ids"]
    ids = sorted(set(seq))
    meta = generate(url, **body, token_ids_logprob=ids).json()["meta_info"]
    inputs, outputs = meta["input_token_ids_logprobs"], meta["output_token_ids_logprobs"]
    assert len(inputs) == meta["prompt_tokens"] and inputs[0] is None
    assert len(outputs) == meta["completion_tokens"]
    plain = meta["input_token_logprobs"][1:] + meta["output_token_logprobs"]
    for entries, (lp, token, _) in zip(inputs[1:] + outputs, plain):  # the logprob of the token that came
        assert [e[1] for e in entries] == ids
        assert abs(dict((e[1], e[0]) for e in entries)[token] - lp) < 1e-5
    with httpx.stream("POST", url + "/generate", json={**body, "token_ids_logprob": ids, "stream": True},
                      timeout=120) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    streamed = [e for ev in events for e in ev["meta_info"]["output_token_ids_logprobs"]]
    assert streamed == outputs
    r = generate(url, text="x", return_logprob=True, token_ids_logprob=[len(tokenizer) + 5])
    assert r.status_code == 400 and "outside the vocabulary" in r.json()["error"]["message"]


def test_structural_tags(url):
    """xgrammar's structural tag (a forced tag holding JSON) and SGLang's legacy form (free text until a
    trigger, then the tagged JSON follows its schema)."""
    schema = {"type": "object", "properties": {"n": {"enum": [1, 2]}}, "required": ["n"], "additionalProperties": False}
    forced = {"type": "structural_tag", "format": {"type": "tag", "begin": "<call>", "end": "</call>",
                                                   "content": {"type": "json_schema", "json_schema": schema}}}
    for o in generate(url, text="Go:", sampling_params={"structural_tag": json.dumps(forced), "max_new_tokens": 60,
                                                        "temperature": 1.0, "n": 2}).json():
        body = re.fullmatch(r"<call>(.*)</call>", o["text"], re.DOTALL)
        assert body and json.loads(body.group(1))["n"] in (1, 2), o["text"]
    legacy = {"type": "structural_tag", "triggers": ["<call>"],
              "structures": [{"begin": "<call>", "schema": schema, "end": "</call>"}]}
    outs = generate(url, text="Go:", sampling_params={"structural_tag": json.dumps(legacy), "max_new_tokens": 20,
                                                      "temperature": 1.0, "n": 2}).json()
    assert all(o["meta_info"]["finish_reason"]["type"] in ("stop", "length") for o in outs)
    r = generate(url, text="x", sampling_params={"structural_tag": '{"structures": [{"begin": "a"}], "triggers": []}'})
    assert r.status_code == 400 and "invalid structural_tag" in r.json()["error"]["message"]


# ---- logprobs under a grammar --------------------------------------------------------------------
def test_generate_top_logprobs_with_grammar_are_allowed_tokens_only(url, tokenizer):
    """SGLang's test_logprob_grammar: the top logprobs of a digits-only regex are digits (and, once the
    regex may end, the stop token), never the tokens the grammar forbids."""
    stops = set(tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))
    for regex in (r"[0-9]{1,4}", r"\d{3}"):
        body = {"text": "Question: how many? Answer:", "return_logprob": True, "top_logprobs_num": 5,
                "return_text_in_logprobs": True,
                "sampling_params": {"regex": regex, "max_new_tokens": 8, "temperature": 1.0, "n": 2}}
        for out in generate(url, **body).json():
            assert re.fullmatch(regex, out["text"]), out["text"]
            tops = out["meta_info"]["output_top_logprobs"]
            assert len(tops) == out["meta_info"]["completion_tokens"]
            for position in tops:
                assert position and sum(math.exp(lp) for lp, _, _ in position) <= 1.0 + 1e-4
                for _, token, text in position:
                    assert token in stops or re.fullmatch("[0-9]+", text), (regex, position)


def test_openai_top_logprobs_with_grammar_are_allowed_tokens_only(client, server):
    allowed = re.compile(r"[0-9]+|<\|im_end\|>|<\|endoftext\|>")  # digits; the stop tokens once the regex ends
    r = client.completions.create(model=server.model_path, prompt="Count:", max_tokens=8, logprobs=5, n=2,
                                  temperature=1.0, extra_body={"regex": "[0-9]{4}"})
    for choice in r.choices:
        assert re.fullmatch("[0-9]{4}", choice.text)
        for token, top in zip(choice.logprobs.tokens, choice.logprobs.top_logprobs, strict=True):
            assert allowed.fullmatch(token) and top and all(allowed.fullmatch(t) for t in top), top
    r = client.chat.completions.create(model=server.model_path, messages=CHAT, max_tokens=8, logprobs=True,
                                       top_logprobs=5, temperature=0, extra_body={"regex": "[0-9]{4}"})
    entries = r.choices[0].logprobs.content
    assert re.fullmatch("[0-9]{4}", r.choices[0].message.content) and entries
    for entry in entries:
        assert entry.top_logprobs and all(allowed.fullmatch(t.token) for t in entry.top_logprobs), entry
        assert math.isclose(entry.logprob, entry.top_logprobs[0].logprob)  # greedy: the most likely allowed token


# ---- stop_regex on the OpenAI routes -------------------------------------------------------------
# the grammar writes three letters then digits; stop_regex stops at the first digit (a one-character match,
# so the stream never sends a part of it before it is complete)
STOP_BODY = {"regex": "[a-c]{3}[0-9]{5}", "stop_regex": ["[0-9]", "never"]}


def check_stopped(text: str, finish_reason: str, matched) -> None:
    assert finish_reason == "stop" and re.fullmatch("[0-9]", matched), (finish_reason, matched)
    assert re.fullmatch("[a-c]{3}", text), text  # trimmed at the match, as on /generate


def test_completions_stop_regex(client, server):
    for stop_regex in ("[0-9]", STOP_BODY["stop_regex"]):
        extra = {**STOP_BODY, "stop_regex": stop_regex}
        r = client.completions.create(model=server.model_path, prompt="Code:", max_tokens=12, n=2, temperature=1.0,
                                      extra_body=extra)
        for choice in r.choices:
            check_stopped(choice.text, choice.finish_reason, choice.model_extra["matched_stop"])
    stream = client.completions.create(model=server.model_path, prompt="Code:", max_tokens=12, stream=True,
                                       extra_body=STOP_BODY)
    chunks = [c.choices[0] for c in stream if c.choices]
    check_stopped("".join(c.text for c in chunks), chunks[-1].finish_reason, chunks[-1].model_extra["matched_stop"])


def test_chat_stop_regex(client, server):
    r = client.chat.completions.create(model=server.model_path, messages=CHAT, max_tokens=12, n=2,
                                       temperature=1.0, extra_body=STOP_BODY)
    for choice in r.choices:
        check_stopped(choice.message.content, choice.finish_reason, choice.model_extra["matched_stop"])
    stream = client.chat.completions.create(model=server.model_path, messages=CHAT, max_tokens=12, stream=True,
                                            extra_body={**STOP_BODY, "stop_regex": "[0-9]"})
    chunks = [c.choices[0] for c in stream if c.choices]
    check_stopped("".join(c.delta.content or "" for c in chunks), chunks[-1].finish_reason,
                  chunks[-1].model_extra["matched_stop"])


@pytest.mark.parametrize("path, body", [("/v1/completions", {"prompt": "x"}), ("/v1/chat/completions",
                                                                              {"messages": CHAT})])
def test_bad_stop_regex_is_a_400(url, path, body):
    for bad, cause in (("(", "not a valid regular expression"), ([1], "stop_regex")):
        r = httpx.post(url + path, json={**body, "stop_regex": bad}, timeout=60)
        assert r.status_code == 400 and cause in r.json()["error"]["message"], r.text
