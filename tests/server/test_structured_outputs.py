"""Structured outputs over HTTP against the shared tiny server (random weights): /generate with
regex / json_schema / ebnf (plain and streamed), OpenAI response_format and SGLang's regex / ebnf
extra fields, and a 400 naming the problem for a grammar that does not compile."""

from __future__ import annotations

import json
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
