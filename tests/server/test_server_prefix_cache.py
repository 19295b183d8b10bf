"""The prefix cache through the server: a DSL program with a shared few-shot prefix and a fork,
chat turns, n > 1 and the counters that show the reuse (meta_info, OpenAI usage, /metrics),
against the same requests on a server started with --disable-radix-cache; /flush_cache while
busy and idle."""

from __future__ import annotations

import threading

import httpx
import pytest
import sglang as sgl
from server_process import launch

FEW_SHOT = "".join(f"Question: what is {a} plus {a}?\nAnswer: {2 * a}.\n" for a in range(1, 40))


@pytest.fixture(scope="module")
def plain(model_path, tmp_path_factory):
    srv = launch(model_path, tmp_path_factory.mktemp("no-cache-logs"), "--disable-radix-cache", name="no-cache")
    yield srv
    srv.stop()


@sgl.function
def two_answers(s, question):
    s += FEW_SHOT + "Question: " + question + "\n"
    forks = s.fork(2)
    for fork, lead in zip(forks, ["Answer:", "Reply:"]):
        fork += lead + sgl.gen("out", max_tokens=8, temperature=0)
    forks.join()
    s["outs"] = [fork["out"] for fork in forks]


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def _run_program(url: str) -> list[list[str]]:
    sgl.set_default_backend(sgl.RuntimeEndpoint(url))
    return [two_answers.run(question=q)["outs"] for q in ("what is 5 plus 7?", "what is 9 plus 1?")]


def test_dsl_fork_reuses_the_shared_prefix_and_answers_the_same(server, plain):
    httpx.post(server.url + "/flush_cache", timeout=30)
    before = _metric(server.url, "sglang:cached_tokens_total")
    computed = _metric(server.url, "sglang:computed_prompt_tokens_total")
    assert _run_program(server.url) == _run_program(plain.url)
    assert _metric(server.url, "sglang:cached_tokens_total") - before > len(FEW_SHOT) // 2  # in tokens: >= 1 char each
    computed_with_cache = _metric(server.url, "sglang:computed_prompt_tokens_total") - computed
    computed_without = _metric(plain.url, "sglang:computed_prompt_tokens_total")
    assert computed_with_cache < computed_without / 2, (computed_with_cache, computed_without)
    assert _metric(server.url, "sglang:prefix_cache_snapshots") > 0
    assert _metric(plain.url, "sglang:cached_tokens_total") == 0


def _chat(url: str, messages: list[dict]) -> dict:
    body = {"model": "default", "messages": messages, "max_tokens": 6, "temperature": 0}
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_turns_report_cached_tokens_and_match(server, plain):
    messages = [{"role": "system", "content": FEW_SHOT}, {"role": "user", "content": "what is 3 plus 3?"}]
    first, first_plain = _chat(server.url, messages), _chat(plain.url, messages)
    assert first["choices"][0]["message"]["content"] == first_plain["choices"][0]["message"]["content"]
    messages += [first["choices"][0]["message"], {"role": "user", "content": "and 4 plus 4?"}]
    second, second_plain = _chat(server.url, messages), _chat(plain.url, messages)
    assert second["choices"][0]["message"]["content"] == second_plain["choices"][0]["message"]["content"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    # the second turn's prompt extends the first turn's prompt and answer: all of that but the answer's
    # last token (never fed) and the template's closing tokens, which were not generated, is reused
    assert first["usage"]["prompt_tokens"] <= cached < second["usage"]["prompt_tokens"]
    assert second_plain["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_n_samples_prefill_the_prompt_once(server):
    """A prompt nothing cached shares: the first sample computes it, the others wait for its snapshot
    of all but the last token and compute one token each."""
    prompt = "".join(f"Question: what is {a} times 3?\nAnswer: {3 * a}.\n" for a in range(1, 40))
    computed = _metric(server.url, "sglang:computed_prompt_tokens_total")
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 4, "n": 4, "temperature": 0.8, "seed": 3}}
    r = httpx.post(server.url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    outs = r.json()
    prompt_len = outs[0]["meta_info"]["prompt_tokens"]
    assert [o["meta_info"]["cached_tokens"] for o in outs][1:] == [prompt_len - 1] * 3
    assert _metric(server.url, "sglang:computed_prompt_tokens_total") - computed <= prompt_len + 3


def test_flush_cache_is_refused_while_busy_and_empties_when_idle(server):
    body = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}}
    done = threading.Event()

    def long_request():
        assert httpx.post(server.url + "/generate", json=body, timeout=300).status_code == 200
        done.set()

    thread = threading.Thread(target=long_request)
    thread.start()
    try:
        for _ in range(200):
            if server.allocator()["num_running_reqs"]:
                break
            threading.Event().wait(0.02)
        r = httpx.post(server.url + "/flush_cache", timeout=30)
        assert r.status_code == 400 and "not flushed" in r.text
    finally:
        thread.join()
    assert done.is_set()
    state = server.allocator()
    assert state["num_snapshots"] > 0 and state["cached_pages"] > 0
    r = httpx.get(server.url + "/flush_cache", timeout=30)
    assert r.status_code == 200
    state = server.allocator()
    assert state["num_snapshots"] == 0 and state["cached_pages"] == 0
    assert state["num_free_pages"] == state["num_pages"] and state["integrity"] == "ok"


def test_a_resent_prompt_hits_on_its_second_send_and_the_counters_show_it(server):
    """The same prompt twice: the first send leaves a snapshot at its last position but one, the
    second restores it. /metrics counts the snapshots taken and restored; /server_info names the
    placement in force and its cached pages include every page it could evict."""
    httpx.post(server.url + "/flush_cache", timeout=30)
    hits = _metric(server.url, "sglang:prefix_cache_snapshots_hit_total")
    body = {"text": "A resent prompt: " + "the same words again and again. " * 12,
            "sampling_params": {"max_new_tokens": 3, "temperature": 0}}
    first, second = (httpx.post(server.url + "/generate", json=body, timeout=120).json() for _ in range(2))
    assert first["meta_info"]["cached_tokens"] == 0
    assert second["meta_info"]["cached_tokens"] == second["meta_info"]["prompt_tokens"] - 1
    assert second["text"] == first["text"]
    assert _metric(server.url, "sglang:prefix_cache_snapshots_hit_total") == hits + 1
    assert _metric(server.url, "sglang:prefix_cache_snapshots_taken_total") > 0
    assert _metric(server.url, "sglang:prefix_cache_snapshot_bytes") > 0
    info = httpx.get(server.url + "/server_info", timeout=30).json()
    assert "four a doubling" in info["snapshot_placement"]
    state = info["internal_states"][0]
    assert 0 < state["evictable_pages"] <= state["cached_pages"] and state["snapshots_hit"] >= 1
