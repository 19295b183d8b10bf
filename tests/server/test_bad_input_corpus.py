"""A bad-input corpus across every route and field: each case is a 4xx whose message or param
names the field, never a 5xx, and the server keeps serving with its pools intact.

Cases come from three sources: the request models' JSON schemas (every field gets each JSON kind
it does not accept, and a lone UTF-16 surrogate where it takes text), a table of out-of-range
values for every native sampling parameter, and whole-body and header faults (malformed or deep
JSON, wrong content types with an Origin, oversized bodies). `python tests/server/test_bad_input_corpus.py`
prints the figures the README quotes.
"""

from __future__ import annotations

import json
import socket
from collections import Counter

import httpx
import pytest

from hybrid_sgl.server.protocol import (
    AbortRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    GenerateRequest,
    TokenizeRequest,
)

CHAT = [{"role": "user", "content": "Hi"}]
ROUTES = {  # path: (request model, a valid body to spoil one field of)
    "/generate": (GenerateRequest, {"text": "Hi", "sampling_params": {"max_new_tokens": 2}}),
    "/v1/completions": (CompletionRequest, {"prompt": "Hi", "max_tokens": 2}),
    "/v1/chat/completions": (ChatCompletionRequest, {"messages": CHAT, "max_tokens": 2}),
    "/tokenize": (TokenizeRequest, {"prompt": "Hi"}),
    "/v1/detokenize": (DetokenizeRequest, {"tokens": [1, 2]}),
    "/abort_request": (AbortRequest, {"rid": "nothing-runs-under-this"}),
}
SAMPLES = {"string": "x", "integer": 7, "number": 2.5, "boolean": True, "array": [1], "object": {"k": 1}}
SURROGATE = "a\ud800b"
SAMPLING_BAD = {  # native sampling_params: values of the right JSON kind but out of range, and wrong kinds
    "max_new_tokens": [-1, 10**6, "5", 2.5, True],
    "min_new_tokens": [-1, 5000, "1"],
    "temperature": [-0.1, -1e39, "hot", True],
    "top_p": [0, 1.5, -1, "x"],
    "top_k": [0, -2, 1.5, "x"],
    "min_p": [-0.1, 1.1, "x"],
    "frequency_penalty": [2.5, -3, 1e39, "x"],
    "presence_penalty": [2.5, -3, -1e39, "x"],
    "repetition_penalty": [0, 1e-300, 3, -1, "x"],
    "logit_bias": [[1], "x", {"x": 1}, {"1": "x"}, {"1": 1e39}, {"1": -1e39}, {"99999999": 1}, {"1": True}],
    "stop": [5, [1], ["x"] * 100, {"a": 1}],
    "stop_token_ids": ["x", [-1], [10**7], [True], [1.5]],
    "n": [0, -1, 129, 10**9, "2", 1.5],
    "seed": ["x", 1.5, True],
    "sampling_seed": ["x", 1.5],
    "stream_interval": ["x", 0, -1, 1.5, True],
    "ignore_eos": ["yes", 1],
    "skip_special_tokens": ["no", 0],
    "spaces_between_special_tokens": [[], 1],
    "no_stop_trim": ["x"],
    "regex": [[], 5, {"a": 1}],
    "json_schema": [[], 5],
    "ebnf": [[], 5],
    "structural_tag": [5],
    "stop_regex": [5, [1]],
    "custom_params": ["x", [1]],
    "max_tokens": [5],  # an OpenAI name on the native API
}


def _kinds(schema: dict, defs: dict) -> set[str] | None:
    """The JSON kinds a property accepts (None: anything)."""
    if "$ref" in schema:
        schema = defs[schema["$ref"].split("/")[-1]]
    if "anyOf" in schema:
        kinds: set[str] = set()
        for sub in schema["anyOf"]:
            sub_kinds = _kinds(sub, defs)
            if sub_kinds is None:
                return None
            kinds |= sub_kinds
        return kinds
    if "enum" in schema or "const" in schema:
        return {"enum"}
    kind = schema.get("type")
    if kind is None:
        return None
    return {kind, "integer"} if kind == "number" else {kind}


def schema_cases() -> list[tuple[str, dict, str]]:
    cases = []
    for path, (model, valid) in ROUTES.items():
        schema = model.model_json_schema()
        for field, prop in schema["properties"].items():
            kinds = _kinds(prop, schema.get("$defs", {}))
            if kinds is None:  # Any: fields for features this server does not have
                if field in GenerateRequest.NOT_SUPPORTED and path == "/generate":
                    cases.append((path, {**valid, field: "x"}, field))
                continue
            for kind, value in SAMPLES.items():
                if kind not in kinds:
                    cases.append((path, {**valid, field: value}, field))
            if "string" in kinds:
                cases.append((path, {**valid, field: SURROGATE}, field))
        cases.append((path, {**valid, "no_such_field": 1}, "no_such_field"))
    return cases


def sampling_cases() -> list[tuple[str, dict, str]]:
    cases = []
    for key, values in SAMPLING_BAD.items():
        for v in values:
            cases.append(("/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2, key: v}}, key))
    for path, extra in [("/v1/completions", {"prompt": "Hi"}), ("/v1/chat/completions", {"messages": CHAT})]:
        for key, v in [("logit_bias", {"1": 1e39}), ("logit_bias", {"x": 1}), ("temperature", 3.0),
                       ("repetition_penalty", 1e-300), ("top_p", 0.0), ("n", 1000), ("top_k", 0),
                       ("max_tokens", -1), ("stop", [1]), ("stop_token_ids", [-5]), ("seed", 1.5),
                       ("messages" if "messages" in extra else "prompt", [SURROGATE]),
                       ("stream_options", {"include_usage": True})]:
            cases.append((path, {**extra, "max_tokens": 2, key: v}, key))
    cases += [
        ("/generate", {"text": "Hi", "return_logprob": True, "top_logprobs_num": 101}, "top_logprobs_num"),
        ("/generate", {"text": "x" * 20000}, "context length"),
        ("/generate", {"text": ["a", "b"], "rid": ["r", "r"]}, "rid"),
        ("/generate", {"text": ["a"] * 20, "sampling_params": {"n": 100}}, "sequences"),
        ("/generate", {"input_ids": [[1], [2, "x"]]}, "input_ids"),
        ("/v1/completions", {"prompt": ["x" * 20000]}, "prompt"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 20000}]}, "messages"),
        ("/tokenize", {"prompt": "x" * 20000}, "prompt"),
        ("/tokenize", {"prompt": "a", "messages": CHAT}, "prompt"),
        ("/v1/detokenize", {"tokens": [10**7]}, "tokens"),
    ]
    return cases


def body_cases() -> list[tuple[str, bytes, dict, int]]:
    """(path, raw body, headers, expected status)."""
    deep = b'{"text": "a", "sampling_params": ' + b'{"a": ' * 1000 + b"1" + b"}" * 1000 + b"}"
    json_ct = {"content-type": "application/json"}
    cases = []
    for path in ROUTES:
        cases += [
            (path, b'{"text": ', json_ct, 400), (path, b"[1, 2]", json_ct, 400), (path, b"", json_ct, 400),
            (path, b"null", json_ct, 400), (path, b'{"a": NaN}', json_ct, 400), (path, b"\xff\xfe", json_ct, 400),
            (path, b'{"text": ' + b"[" * 1000 + b"]" * 1000 + b"}", json_ct, 400), (path, deep, json_ct, 400),
            (path, b'{"a": 1' + b"0" * 30 + b"}", json_ct, 400),
            (path, json.dumps(ROUTES[path][1]).encode(), {"content-type": "text/plain", "origin": "http://a.example"},
             415),
            (path, b"text=hi", {"content-type": "application/x-www-form-urlencoded", "origin": "null"}, 415),
        ]
    return cases


CASES = schema_cases() + sampling_cases()
BODY_CASES = body_cases()
FIGURES: Counter = Counter()


def _check(r: httpx.Response, expected_status: int | None = None) -> dict:
    FIGURES["cases"] += 1
    FIGURES[f"{r.status_code // 100}xx"] += 1
    assert r.status_code < 500, r.text[:300]
    if expected_status is not None:
        assert r.status_code == expected_status, r.text[:300]
    else:
        assert 400 <= r.status_code < 500, r.text[:300]
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


@pytest.fixture(scope="module")
def client(server):
    # A fresh connection per request: on a kept-alive one each response waits ~40 ms for a delayed ACK
    # while the launcher's socket lacks TCP_NODELAY.
    with httpx.Client(base_url=server.url, timeout=60, limits=httpx.Limits(max_keepalive_connections=0)) as c:
        yield c


def post_json(client: httpx.Client, path: str, body: dict) -> httpx.Response:
    """JSON with \\u escapes (a lone surrogate is sent as the six characters a client would send)."""
    return client.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


@pytest.mark.parametrize("path,body,field", CASES, ids=[f"{c[0]}:{c[2]}:{i}" for i, c in enumerate(CASES)])
def test_bad_field_is_a_4xx_naming_it(client, path, body, field):
    error = _check(post_json(client, path, body))
    named = field.lower() in error["message"].lower() or (error["param"] or "").startswith(field)
    assert named, f"{field}: {error}"


@pytest.mark.parametrize("path,raw,headers,status", BODY_CASES, ids=[f"{c[0]}:{i}" for i, c in enumerate(BODY_CASES)])
def test_bad_body_or_headers_is_a_4xx(client, path, raw, headers, status):
    _check(client.post(path, content=raw, headers=headers), status)


def test_oversized_body_is_a_413_before_it_is_read(url):
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 999999999999\r\n\r\n{")
        head = b""
        while not head.endswith(b"}}"):
            chunk = sock.recv(4096)
            assert chunk, head
            head += chunk
        head = head.decode()
    FIGURES["cases"] += 1
    FIGURES["4xx"] += 1
    assert head.startswith("HTTP/1.1 413") and "at most" in head, head


def test_curl_form_post_without_origin_still_works(url):
    r = httpx.post(url + "/generate", content=b'{"text": "Hi", "sampling_params": {"max_new_tokens": 2}}',
                   headers={"content-type": "application/x-www-form-urlencoded"}, timeout=60)
    assert r.status_code == 200, r.text


def test_after_the_corpus_the_server_serves_and_nothing_leaked(server):
    r = httpx.post(server.url + "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}}, timeout=60)
    assert r.status_code == 200
    state = server.wait_idle()
    assert state["integrity"] == "ok" and state["num_free_slots"] == state["num_slots"]
    assert state["num_free_pages"] == state["num_pages"]
    print(f"\nbad-input corpus: {dict(FIGURES)}")


if __name__ == "__main__":
    print(f"{len(CASES)} field cases, {len(BODY_CASES)} body/header cases")
