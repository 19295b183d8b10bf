"""SGLang's native API against the real server: /generate shapes, batch, n, streaming, logprobs,
prefill-only calls, stop conditions, info / health / metrics endpoints."""

from __future__ import annotations

import json
import math
import threading
import time

import httpx
import pytest

LONG_PROMPT = ("Hybrid language models mix attention layers with recurrent state space layers. " * 6).strip()


def generate(url: str, **body) -> httpx.Response:
    return httpx.post(url + "/generate", json=body, timeout=120)


def ok(url: str, **body):
    r = generate(url, **body)
    assert r.status_code == 200, r.text
    return r.json()


def sse_events(url: str, **body) -> list:
    """The decoded `data:` payloads of a streaming call; the last one must be [DONE]."""
    events = []
    with httpx.stream("POST", url + "/generate", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data:"):
                events.append(line[len("data:"):].strip())
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


def test_single_text_shape(url, tokenizer):
    out = ok(url, text="The capital of France is", sampling_params=GREEDY)
    meta = out["meta_info"]
    assert set(out) >= {"text", "output_ids", "meta_info"}
    assert len(out["output_ids"]) == 12 == meta["completion_tokens"]
    assert meta["prompt_tokens"] == len(tokenizer.encode("The capital of France is"))
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["cached_tokens"] == 0 and isinstance(meta["id"], str) and meta["e2e_latency"] > 0
    assert out["text"] == tokenizer.decode(out["output_ids"], skip_special_tokens=True)


def test_input_ids_and_batch_match_single(url, tokenizer):
    prompts = ["Once upon a time", "Question: what is two plus two?"]
    singles = [ok(url, text=p, sampling_params=GREEDY) for p in prompts]
    batch = ok(url, text=prompts, sampling_params=GREEDY)
    assert isinstance(batch, list) and len(batch) == 2
    assert [b["output_ids"] for b in batch] == [s["output_ids"] for s in singles]
    ids = ok(url, input_ids=tokenizer.encode(prompts[0]), sampling_params=GREEDY)
    assert ids["output_ids"] == singles[0]["output_ids"]
    ids_batch = ok(url, input_ids=[tokenizer.encode(p) for p in prompts], sampling_params=[GREEDY, GREEDY])
    assert [b["output_ids"] for b in ids_batch] == [s["output_ids"] for s in singles]


def test_n_samples_with_seed(url):
    params = {"n": 3, "temperature": 1.0, "max_new_tokens": 8, "ignore_eos": True, "sampling_seed": 7}
    first = ok(url, text="Hello", sampling_params=params)
    again = ok(url, text="Hello", sampling_params=params)
    assert isinstance(first, list) and len(first) == 3
    assert len({r["meta_info"]["id"] for r in first}) == 3
    assert [r["output_ids"] for r in first] == [r["output_ids"] for r in again]  # seeded: reproducible
    assert len({tuple(r["output_ids"]) for r in first}) > 1  # but the n samples differ
    batch = ok(url, text=["Hello", "Bye"], sampling_params={**params, "n": 2})
    assert len(batch) == 4  # prompt-major, n per prompt


def test_streaming_is_cumulative_and_matches(url):
    body = dict(text=LONG_PROMPT, sampling_params=GREEDY, return_logprob=True, top_logprobs_num=2)
    final = ok(url, **body)
    events = sse_events(url, **body)
    texts = [e["text"] for e in events]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # cumulative
    assert texts[-1] == final["text"]
    assert events[-1]["output_ids"] == final["output_ids"]
    assert events[-1]["meta_info"]["finish_reason"] == final["meta_info"]["finish_reason"]
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    streamed = [lp for e in events for lp in e["meta_info"]["output_token_logprobs"]]  # deltas
    assert [x[1] for x in streamed] == final["output_ids"]
    assert all(abs(a[0] - b[0]) < 1e-5 for a, b in zip(streamed, final["meta_info"]["output_token_logprobs"]))
    tops = [t for e in events for t in e["meta_info"]["output_top_logprobs"]]
    assert len(tops) == 12 and all(len(t) == 2 for t in tops)


def test_batch_streaming_carries_index(url):
    events = sse_events(url, text=["Hello", "Once upon a time"], sampling_params={**GREEDY, "max_new_tokens": 4})
    assert {e["index"] for e in events} == {0, 1}
    last = {e["index"]: e for e in events}
    assert all(len(e["output_ids"]) == 4 and e["meta_info"]["finish_reason"]["type"] == "length"
               for e in last.values())


@pytest.mark.parametrize("start", [0, 1, 5, -1, "last", "len"])
def test_logprob_start_len_arithmetic(url, tokenizer, start):
    n = len(tokenizer.encode(LONG_PROMPT))
    start = {"last": n - 1, "len": n}.get(start, start)
    out = ok(url, text=LONG_PROMPT, sampling_params={**GREEDY, "max_new_tokens": 3}, return_logprob=True,
             logprob_start_len=start, top_logprobs_num=3, return_text_in_logprobs=True)
    meta = out["meta_info"]
    inputs = meta["input_token_logprobs"]
    resolved = n if start == -1 else start
    assert meta["prompt_tokens"] == resolved + len(inputs)
    assert [x[1] for x in inputs] == tokenizer.encode(LONG_PROMPT)[resolved:]
    assert len(meta["input_top_logprobs"]) == len(inputs)
    if start == 0:
        assert inputs[0][0] is None and meta["input_top_logprobs"][0] is None
    real = [x for x in inputs if x[0] is not None]
    assert all(x[0] <= 0 and x[2] == tokenizer.decode([x[1]]) for x in real)
    assert len(meta["output_token_logprobs"]) == 3


def test_decode_logprobs_equal_reprefill_logprobs(url, tokenizer):
    """Logprobs sampled while decoding == the same tokens scored by a prefill (chunked: > 64 tokens)."""
    prompt = tokenizer.encode(LONG_PROMPT)
    assert len(prompt) > 64
    gen = ok(url, input_ids=prompt, sampling_params={**GREEDY, "max_new_tokens": 24}, return_logprob=True)
    decoded = gen["meta_info"]["output_token_logprobs"]
    scored = ok(url, input_ids=prompt + gen["output_ids"], sampling_params={"max_new_tokens": 0},
                return_logprob=True, logprob_start_len=len(prompt))
    meta = scored["meta_info"]
    assert meta["completion_tokens"] == 0 and scored["output_ids"] == []
    inputs = meta["input_token_logprobs"]
    assert [x[1] for x in inputs] == gen["output_ids"]
    assert max(abs(a[0] - b[0]) for a, b in zip(inputs, decoded)) < 1e-4


def test_prefill_only_call(url, tokenizer):
    out = ok(url, text="Hello there", sampling_params={"max_new_tokens": 0})
    assert out["text"] == "" and out["output_ids"] == []
    assert out["meta_info"]["prompt_tokens"] == len(tokenizer.encode("Hello there"))
    assert out["meta_info"]["finish_reason"]["type"] == "length"


def test_stop_string_and_stop_token(url, tokenizer):
    free = ok(url, text=LONG_PROMPT, sampling_params={**GREEDY, "max_new_tokens": 16})
    ids = free["output_ids"]
    stop_id = ids[5]
    first = ids.index(stop_id)
    by_token = ok(url, text=LONG_PROMPT, sampling_params={**GREEDY, "max_new_tokens": 16, "stop_token_ids": [stop_id]})
    assert by_token["output_ids"] == ids[: first + 1]
    assert by_token["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    text = free["text"]
    starts = [i for i in range(len(text) // 3, len(text) - 1) if text[i:i + 2].isascii() and text[i:i + 2].isalpha()]
    stop = text[starts[0]: starts[0] + 2]
    by_string = ok(url, text=LONG_PROMPT, sampling_params={**GREEDY, "max_new_tokens": 16, "stop": [stop]})
    assert by_string["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert by_string["text"] == text[: text.index(stop)]


def test_nulls_mean_defaults(url):
    """SGLang's frontend sends every sampling key, null when unset."""
    params = {k: None for k in ("min_new_tokens", "n", "stop", "stop_token_ids", "stop_regex", "top_p", "top_k",
                                "min_p", "frequency_penalty", "presence_penalty", "ignore_eos", "regex",
                                "json_schema", "seed", "sampling_seed", "stream_interval", "logit_bias")}
    out = ok(url, text="Hi", sampling_params={**params, "max_new_tokens": 3, "temperature": 0})
    assert out["meta_info"]["completion_tokens"] <= 3


def test_model_and_server_info(url, server):
    for path in ("/get_model_info", "/model_info"):
        info = httpx.get(url + path).json()
        assert info["model_path"] == server.model_path and info["is_generation"] is True
    for path in ("/server_info", "/get_server_info"):
        info = httpx.get(url + path).json()
        assert info["max_total_num_tokens"] > 0 and info["max_running_requests"] >= 32
        assert info["version"] and info["context_length"] == 1024 and info["chunked_prefill_size"] == 64
        state = info["internal_states"][0]
        assert state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0


def test_health_and_flush(url):
    assert httpx.get(url + "/health").status_code == 200
    assert httpx.get(url + "/health_generate", timeout=30).status_code == 200
    assert httpx.post(url + "/flush_cache").status_code == 200
    assert httpx.get(url + "/flush_cache").status_code == 200


def test_metrics(url):
    before = _metric_values(httpx.get(url + "/metrics").text)
    ok(url, text="Hello", sampling_params={**GREEDY, "max_new_tokens": 5})
    text = httpx.get(url + "/metrics").text
    after = _metric_values(text)
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage", "sglang:gen_throughput",
                 "sglang:time_to_first_token_seconds_bucket", "sglang:e2e_request_latency_seconds_count"):
        assert name in after, name
    assert "# TYPE sglang:time_to_first_token_seconds histogram" in text
    assert after["sglang:num_requests_total"] == before["sglang:num_requests_total"] + 1
    assert after["sglang:generation_tokens_total"] == before["sglang:generation_tokens_total"] + 5
    assert after["sglang:time_to_first_token_seconds_count"] == before["sglang:time_to_first_token_seconds_count"] + 1
    assert after["sglang:gen_throughput"] > 0
    assert after["sglang:num_running_reqs"] == 0


def _metric_values(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            values.setdefault(name, float(value))  # first bucket for histograms; fine for these checks
    assert all(math.isfinite(v) for v in values.values())
    return values


def test_tokenize_and_detokenize(url, tokenizer):
    r = httpx.post(url + "/tokenize", json={"prompt": "Hello there"}).json()
    assert r == {"tokens": tokenizer.encode("Hello there"), "count": len(tokenizer.encode("Hello there")),
                 "max_model_len": 1024}
    batch = httpx.post(url + "/v1/tokenize", json={"prompt": ["a b", "Hello"]}).json()
    assert batch["tokens"] == [tokenizer.encode("a b"), tokenizer.encode("Hello")] and len(batch["count"]) == 2
    messages = [{"role": "user", "content": "Hi"}]
    chat = httpx.post(url + "/tokenize", json={"messages": messages}).json()
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat["tokens"] == tokenizer.encode(rendered, add_special_tokens=False)
    text = httpx.post(url + "/detokenize", json={"tokens": r["tokens"]}).json()["text"]
    assert text == "Hello there"
    assert httpx.post(url + "/detokenize", json={"tokens": [10**7]}).status_code == 400


def test_abort_request(url):
    result = {}

    def run():
        result["out"] = ok(url, text="Hello", rid="to-abort",
                           sampling_params={"max_new_tokens": 900, "ignore_eos": True})

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 10
    while httpx.get(url + "/server_info").json()["internal_states"][0]["num_running_reqs"] == 0:
        assert time.monotonic() < deadline
    assert httpx.post(url + "/abort_request", json={"rid": "to-abort"}).status_code == 200
    thread.join(30)
    meta = result["out"]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and meta["completion_tokens"] < 900
