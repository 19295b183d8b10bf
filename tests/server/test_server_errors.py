"""Bad input gets a 4xx naming the cause (never a 500, never silently ignored) and the server keeps
serving; a client that disconnects has its request aborted and its slot and pages freed."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

OK_BODY = {"text": "Hello", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
CHAT = [{"role": "user", "content": "Hi"}]
LONG_TEXT = "word " * 3000  # far more tokens than the 1024-token context

# (path, body (dict, or raw bytes), expected status, words the error message must contain)
CASES = [
    # malformed / not an object / empty
    ("/generate", b'{"text": "Hello", ', 400, "malformed JSON"),
    ("/generate", b"[1, 2, 3]", 400, "JSON object"),
    ("/generate", b"", 400, "empty"),
    ("/generate", b'{"text": "a", "sampling_params": {"temperature": NaN}}', 400, "NaN"),
    ("/v1/completions", b"{model: x}", 400, "malformed JSON"),
    ("/generate", b'{"text": "a", "sampling_params": {"top_k": 100000000000000000000}}', 400, "64-bit range"),
    # wrong types
    ("/generate", {"text": 5}, 400, "text"),
    ("/generate", {"text": "a", "sampling_params": "fast"}, 400, "sampling_params"),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": "10"}}, 400, "max_new_tokens"),
    ("/generate", {"text": "a", "sampling_params": {"temperature": "hot"}}, 400, "temperature"),
    ("/generate", {"text": "a", "stream": "yes"}, 400, "stream"),
    ("/generate", {"input_ids": [1, 2.5]}, 400, "input_ids"),
    ("/generate", {"text": "a", "return_logprob": True, "logprob_start_len": "3"}, 400, "logprob_start_len"),
    ("/v1/completions", {"prompt": "a", "max_tokens": "5"}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
    ("/v1/chat/completions", {"messages": CHAT, "n": "2"}, 400, "n"),
    # missing / unknown fields
    ("/generate", {"sampling_params": {"max_new_tokens": 2}}, 400, "text"),
    ("/generate", {"text": "a", "input_ids": [1]}, 400, "input_ids"),
    ("/generate", {"text": "a", "sampling_params": {"max_tokens": 3}}, 400, "max_tokens"),
    ("/generate", {"text": "a", "temperature": 0}, 400, "temperature"),
    ("/v1/completions", {"model": "m"}, 400, "prompt"),
    ("/v1/chat/completions", {"model": "m"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": CHAT, "frequency_penaltyy": 1}, 400, "frequency_penaltyy"),
    # negative or oversized limits
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": -1}}, 400, "max_new_tokens"),
    ("/generate", {"text": "a", "sampling_params": {"max_new_tokens": 100000}}, 400, "context length"),
    ("/generate", {"text": "a", "sampling_params": {"n": 0}}, 400, "n must be"),
    ("/generate", {"text": "a", "sampling_params": {"n": 10**9}}, 400, "at most 1024"),
    ("/generate", {"text": ["a"] * 100, "sampling_params": {"n": 100}}, 400, "at most 1024"),
    ("/v1/completions", {"prompt": ["a"] * 100, "n": 100}, 400, "at most 1024"),
    ("/generate", {"text": "a", "sampling_params": {"temperature": -0.5}}, 400, "temperature"),
    ("/generate", {"text": "a", "sampling_params": {"top_p": 0}}, 400, "top_p"),
    ("/generate", {"text": "a", "sampling_params": {"top_k": 0}}, 400, "top_k"),
    ("/generate", {"text": "a", "sampling_params": {"min_new_tokens": 5, "max_new_tokens": 2}}, 400,
     "min_new_tokens"),
    ("/generate", {"text": "a", "sampling_params": {"stop": ["x"] * 100}}, 400, "stop"),
    ("/v1/completions", {"prompt": "a", "max_tokens": -3}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 5000}, 400, "context length"),
    ("/v1/completions", {"prompt": "a", "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": "a", "temperature": 2.5}, 400, "temperature"),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": 99999}, 400, "context length"),
    ("/v1/chat/completions", {"messages": CHAT, "logit_bias": {"5": 500}}, 400, "logit_bias"),
    # prompt longer than the context length
    ("/generate", {"text": LONG_TEXT}, 400, "context length"),
    ("/generate", {"input_ids": [5] * 1024}, 400, "context length"),
    ("/v1/completions", {"prompt": LONG_TEXT}, 400, "context length"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG_TEXT}]}, 400, "context length"),
    ("/generate", {"text": "word " * 40000}, 400, "context length"),  # tokenized off the event loop
    ("/generate", {"text": ""}, 400, "empty"),
    # out-of-vocabulary token ids
    ("/generate", {"input_ids": [1, 2, 10**6]}, 400, "vocabulary"),
    ("/generate", {"input_ids": [-1, 2]}, 400, "vocabulary"),
    ("/generate", {"text": "a", "sampling_params": {"stop_token_ids": [10**6]}}, 400, "vocabulary"),
    ("/v1/completions", {"prompt": [1, 99999]}, 400, "vocabulary"),
    # too many logprobs
    ("/generate", {"text": "a", "return_logprob": True, "top_logprobs_num": 10**6}, 400, "top_logprobs_num"),
    ("/generate", {"text": "a", "return_logprob": True, "logprob_start_len": 50}, 400, "logprob_start_len"),
    ("/v1/completions", {"prompt": "a", "logprobs": 6}, 400, "logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ("/v1/chat/completions", {"messages": CHAT, "top_logprobs": 2}, 400, "top_logprobs"),
    # stream_options without stream
    ("/v1/completions", {"prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/chat/completions", {"messages": CHAT, "stream": False, "stream_options": {"include_usage": True}}, 400,
     "stream_options"),
    # features that do not exist yet
    ("/generate", {"text": "a", "sampling_params": {"regex": []}}, 400, "regex must be a string"),
    ("/generate", {"text": "a", "sampling_params": {"json_schema": 5}}, 400, "json_schema must be a string"),
    ("/generate", {"text": "a", "image_data": "x.png"}, 400, "image_data is not supported yet"),
    ("/v1/completions", {"prompt": "a", "regex": ["[ab]+"]}, 400, "regex"),
    ("/v1/completions", {"prompt": "a", "suffix": "end"}, 400, "suffix is not supported yet"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "yaml"}}, 400,
     "response_format type 'yaml' is not supported"),
    ("/v1/chat/completions", {"messages": CHAT, "tools": [{"type": "function", "function": {"name": "f"}}],
                              "tool_choice": "required"}, 400, "start the server with --tool-call-parser"),
    ("/v1/chat/completions", {"messages": CHAT, "tools": [{"type": "function"}]}, 400, "each tool must be"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}, 400, "not supported yet"),
]


def post(url: str, path: str, body) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.post(url + path, content=body, headers={"content-type": "application/json"}, timeout=60)
    return httpx.post(url + path, json=body, timeout=60)


@pytest.mark.parametrize("path,body,status,words", CASES, ids=[f"{c[0]}:{c[3]}" for c in CASES])
def test_bad_input_is_a_4xx_naming_the_cause(url, path, body, status, words):
    r = post(url, path, body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert words.lower() in error["message"].lower(), error["message"]
    assert post(url, "/generate", OK_BODY).status_code == 200  # still serving


def test_streaming_errors_come_before_the_stream(url):
    r = post(url, "/generate", {"text": "a", "stream": True, "sampling_params": {"max_new_tokens": -1}})
    assert r.status_code == 400 and "max_new_tokens" in r.json()["error"]["message"]
    r = post(url, "/v1/chat/completions", {"messages": CHAT, "stream": True, "max_tokens": 5000})
    assert r.status_code == 400


def test_unknown_route_and_wrong_method(url):
    r = httpx.get(url + "/no/such/route")
    assert r.status_code == 404 and "no route" in r.json()["error"]["message"]
    r = httpx.get(url + "/generate")
    assert r.status_code == 405 and "GET" in r.json()["error"]["message"]


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


LONG_GEN = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}


def test_streaming_disconnect_aborts_and_frees(server):
    url = server.url
    aborted = _metric(url, "sglang:num_aborted_requests_total")
    with httpx.stream("POST", url + "/generate", json={**LONG_GEN, "stream": True}, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):  # the first token arrived: it runs, then we leave mid-generation
                running = server.allocator()
                assert running["num_running_reqs"] == 1 and running["num_free_pages"] < running["num_pages"]
                break
    state = server.wait_idle()
    assert state["num_running_reqs"] == 0 and state["num_free_slots"] == state["num_slots"]
    assert state["num_free_pages"] == state["num_pages"] and state["integrity"] == "ok"
    assert _metric(url, "sglang:num_aborted_requests_total") == aborted + 1
    assert post(url, "/generate", OK_BODY).status_code == 200


def test_non_streaming_disconnect_aborts_and_frees(server):
    url = server.url
    aborted = _metric(url, "sglang:num_aborted_requests_total")
    body = json.dumps(LONG_GEN).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        deadline = time.monotonic() + 10
        while server.allocator()["num_running_reqs"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.allocator()["num_running_reqs"] == 1
    state = server.wait_idle()
    assert state["num_running_reqs"] == 0 and state["num_free_pages"] == state["num_pages"]
    assert state["integrity"] == "ok"
    assert _metric(url, "sglang:num_aborted_requests_total") == aborted + 1
    assert post(url, "/generate", OK_BODY).status_code == 200


def test_many_disconnects_in_parallel_leave_nothing_behind(server):
    def leave_early(i: int) -> None:
        body = {**LONG_GEN, "text": f"Story {i}", "stream": True}
        with httpx.stream("POST", server.url + "/generate", json=body, timeout=60) as r:
            for n, _line in enumerate(r.iter_lines()):
                if n > 2 * (i % 3):
                    break

    threads = [threading.Thread(target=leave_early, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    state = server.wait_idle()
    assert state["num_free_slots"] == state["num_slots"] and state["num_free_pages"] == state["num_pages"]
    assert state["integrity"] == "ok"
