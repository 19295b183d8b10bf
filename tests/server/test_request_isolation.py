"""Request isolation: a client rid that a running request holds is refused (409) on every route,
never answered with another request's tokens; a batch that repeats a rid is a 400; abort reaches
every sample of an n > 1 request and every item of a batch; a finished rid can be used again."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from hybrid_sgl.request_ids import DuplicateRidError, RidRegistry, sequence_ids

LONG = {"max_new_tokens": 900, "ignore_eos": True}


class Background:
    """A request running on a thread; .result() waits for its response."""

    def __init__(self, url: str, path: str, body: dict):
        self.response: httpx.Response | None = None
        self.thread = threading.Thread(target=self._run, args=(url + path, body))
        self.thread.start()

    def _run(self, url: str, body: dict) -> None:
        self.response = httpx.post(url, json=body, timeout=120)

    def result(self) -> httpx.Response:
        self.thread.join(120)
        assert self.response is not None, "the request hung"
        return self.response


def wait_running(server, count: int) -> None:
    deadline = time.monotonic() + 20
    while server.allocator()["num_running_reqs"] + server.allocator()["num_waiting_reqs"] < count:
        assert time.monotonic() < deadline, "the background request never started"
        time.sleep(0.01)


@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": "second", "rid": "dup", "sampling_params": {"max_new_tokens": 3}}),
    ("/generate", {"text": "second", "rid": "dup", "stream": True, "sampling_params": {"max_new_tokens": 3}}),
    ("/generate", {"text": ["x", "y"], "rid": ["other", "dup"], "sampling_params": {"max_new_tokens": 3}}),
    ("/v1/completions", {"prompt": "second", "rid": "dup", "max_tokens": 3}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "rid": "dup", "max_tokens": 3}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "rid": "dup", "max_tokens": 3,
                              "stream": True}),
])
def test_rid_in_use_is_a_409_and_the_first_request_is_untouched(server, path, body):
    first = Background(server.url, "/generate", {"text": "first", "rid": "dup", "sampling_params": LONG})
    wait_running(server, 1)
    r = httpx.post(server.url + path, json=body, timeout=30)
    assert r.status_code == 409, r.text
    assert "'dup'" in r.json()["error"]["message"] and r.json()["error"]["param"] == "rid"
    httpx.post(server.url + "/abort_request", json={"rid": "dup"}, timeout=10)
    out = first.result().json()
    assert out["meta_info"]["id"] == "dup" and out["meta_info"]["finish_reason"]["type"] == "abort"
    state = server.wait_idle()
    assert state["num_free_slots"] == state["num_slots"] and state["integrity"] == "ok"


def test_a_derived_sample_id_is_taken_too(server):
    first = Background(server.url, "/generate", {"text": "first", "rid": "fam", "sampling_params": {**LONG, "n": 2}})
    wait_running(server, 2)
    for rid in ("fam", "fam-0", "fam-1"):
        r = httpx.post(server.url + "/generate", json={"text": "b", "rid": rid}, timeout=30)
        assert r.status_code == 409, (rid, r.text)
    assert httpx.post(server.url + "/generate", json={"text": "b", "rid": "fam-2", "sampling_params": {
        "max_new_tokens": 2}}, timeout=30).status_code == 200
    httpx.post(server.url + "/abort_request", json={"rid": "fam"}, timeout=10)
    outs = first.result().json()
    assert [o["meta_info"]["id"] for o in outs] == ["fam-0", "fam-1"]
    assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in outs)
    server.wait_idle()


@pytest.mark.parametrize("body,words", [
    ({"text": ["a", "b"], "rid": ["same", "same"]}, "'same' appears twice"),
    ({"text": ["a", "b"], "rid": ["r", "r-0"], "sampling_params": [{"n": 2}, {}]}, "'r-0' appears twice"),
    ({"text": ["a", "b"], "rid": ["only-one"]}, "rid has 1 entries for 2 prompts"),
    ({"text": "a", "rid": ""}, "non-empty string"),
])
def test_a_batch_that_repeats_a_rid_is_a_400(url, body, words):
    r = httpx.post(url + "/generate", json=body, timeout=30)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_abort_reaches_every_sample_and_every_batch_item(server):
    n_req = Background(server.url, "/generate", {"text": "a", "rid": "many", "sampling_params": {**LONG, "n": 3}})
    batch = Background(server.url, "/generate", {"text": ["b", "c"], "rid": "items", "sampling_params": LONG})
    wait_running(server, 5)
    for rid in ("many", "items"):
        assert httpx.post(server.url + "/abort_request", json={"rid": rid}, timeout=10).status_code == 200
    samples, items = n_req.result().json(), batch.result().json()
    assert [o["meta_info"]["id"] for o in samples] == ["many-0", "many-1", "many-2"]
    assert [o["meta_info"]["id"] for o in items] == ["items-0", "items-1"]
    assert all(o["meta_info"]["finish_reason"]["type"] == "abort" for o in samples + items)
    assert all(o["meta_info"]["completion_tokens"] < LONG["max_new_tokens"] for o in samples + items)
    state = server.wait_idle()
    assert state["num_free_pages"] == state["num_pages"] and state["integrity"] == "ok"


def test_one_sample_can_be_aborted_alone(server):
    req = Background(server.url, "/generate", {"text": "a", "rid": "pair", "sampling_params": {**LONG, "n": 2,
                                                                                              "max_new_tokens": 300}})
    wait_running(server, 2)
    httpx.post(server.url + "/abort_request", json={"rid": "pair-1"}, timeout=10)
    outs = req.result().json()
    assert [o["meta_info"]["finish_reason"]["type"] for o in outs] == ["length", "abort"]
    server.wait_idle()


def test_a_finished_rid_can_be_used_again_and_answers_with_its_own_tokens(url):
    body = {"input_ids": [5, 6, 7], "rid": "again", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    other = {**body, "input_ids": [9, 8, 7, 6]}
    a, b = (httpx.post(url + "/generate", json=x, timeout=30).json() for x in (body, other))
    assert httpx.post(url + "/generate", json=body, timeout=30).json()["output_ids"] == a["output_ids"]
    assert a["meta_info"]["prompt_tokens"] == 3 and b["meta_info"]["prompt_tokens"] == 4


def test_concurrent_requests_under_one_rid_one_wins_the_rest_are_409(url):
    results: list[int] = []
    body = {"text": "race", "rid": "race", "sampling_params": {"max_new_tokens": 30, "ignore_eos": True}}

    def go():
        results.append(httpx.post(url + "/generate", json=body, timeout=60).status_code)

    threads = [threading.Thread(target=go) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 6 and set(results) <= {200, 409} and results.count(200) >= 1


# ---- the registry alone --------------------------------------------------------------------------
def test_registry_reserve_release_and_lookup():
    reg = RidRegistry()
    a, b = reg.new_internal_id("x"), reg.new_internal_id("x")
    assert a != b
    reg.reserve({a: ("x", "x-0"), b: ("x", "x-1")})
    with pytest.raises(DuplicateRidError, match="'x-1'"):
        reg.reserve({"other": ("x-1",)})
    assert reg.internal_ids("x") == sorted([a, b]) and reg.internal_ids("x-0") == [a]
    reg.release(a)
    assert reg.internal_ids("x") == [b] and reg.internal_ids("x-0") == []
    reg.reserve({"c": ("x-0",)})  # free again
    reg.release(b)
    reg.release("c")
    assert len(reg) == 0 and reg.internal_ids("x") == []


def test_sequence_ids_derive_and_refuse_repeats():
    new = iter(["u1", "u2"]).__next__
    assert sequence_ids(None, 2, [1, 1], new) == [[("u1",)], [("u2",)]]
    assert sequence_ids("r", 1, [2], new) == [[("r", "r-0"), ("r", "r-1")]]
    assert sequence_ids("r", 2, [1, 2], new) == [[("r", "r-0")], [("r", "r-1", "r-1-0"), ("r", "r-1", "r-1-1")]]
    with pytest.raises(ValueError, match="appears twice"):
        sequence_ids(["a", "a"], 2, [1, 1], new)
