"""Two CPU servers behind sglang-router (SGLang's Rust load balancer, `pip install hybrid_sgl[router]`):
the endpoints the router calls on its workers, requests spread over both, and cache-aware routing
sending a shared prefix back to the worker that holds it. Which worker served a request is read
from the workers' own /metrics. The router tests skip, naming the cause, where the router's binary
cannot be imported; the worker-side tests always run."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import httpx
import pytest
from server_process import free_port, launch, stop_process

ROUTER_STARTUP_TIMEOUT_S = 60
REQUEST_TIMEOUT_S = 60
# The body sglang-router 0.3.2 forwards for {"text": ..., "sampling_params": ...}: it re-serializes
# the request with its own defaults (captured from the router).
ROUTER_GENERATE_DEFAULTS = {"model": None, "return_text_in_logprobs": False, "stream": False, "log_metrics": True,
                            "return_hidden_states": False, "background": False, "no_logs": False,
                            "return_bytes": False, "return_entropy": False}
ROUTER_CHAT_DEFAULTS = {"logprobs": False, "stream": False, "no_stop_trim": False, "ignore_eos": False,
                        "continue_final_message": False, "skip_special_tokens": True, "separate_reasoning": True,
                        "stream_reasoning": True, "return_hidden_states": False}


def _router_import_error() -> str | None:
    try:
        import sglang_router.sglang_router_rs  # noqa: F401  (the compiled router)
    except ImportError as e:
        return f"sglang-router is not usable here ({e}); install it with pip install 'hybrid_sgl[router]'"
    return None


@pytest.fixture(scope="module")
def workers(model_path, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("router-logs")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(launch, model_path, log_dir, name=f"worker{i}") for i in range(2)]
    failed = [f.exception() for f in futures if f.exception() is not None]
    started = [f.result() for f in futures if f.exception() is None]
    if failed:  # stop the one that did start before reporting the other
        for s in started:
            s.stop()
        raise failed[0]
    yield started
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda s: s.stop(), started))


@dataclass
class RouterProcess:
    process: subprocess.Popen | None
    url: str
    log_path: str
    unusable: str | None  # why the router cannot run here

    def log_tail(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return "".join(f.readlines()[-30:])


@pytest.fixture(scope="module", autouse=True)
def router_process(workers, tmp_path_factory):
    """Started as soon as the workers answer, so that its start-up (mostly imports) overlaps the
    worker-side tests; `router` waits for it."""
    log_path = str(tmp_path_factory.mktemp("router-log") / "router.log")
    reason = _router_import_error()
    if reason is not None:
        yield RouterProcess(None, "", log_path, reason)
        return
    port = free_port()
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--worker-urls", *(w.url for w in workers),
           "--host", "127.0.0.1", "--port", str(port), "--policy", "cache_aware",
           "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
           "--worker-startup-check-interval", "1", "--log-level", "warn"]
    with open(log_path, "w") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield RouterProcess(process, f"http://127.0.0.1:{port}", log_path, None)
    finally:
        stop_process(process, 15)


@pytest.fixture(scope="module")
def router(router_process) -> str:
    """The router's URL once it has registered both workers as healthy."""
    rp = router_process
    if rp.unusable is not None:
        pytest.skip(rp.unusable)
    deadline = time.monotonic() + ROUTER_STARTUP_TIMEOUT_S
    while True:
        if rp.process.poll() is not None:
            raise AssertionError(f"the router exited with {rp.process.returncode}:\n{rp.log_tail()}")
        try:
            listed = httpx.get(rp.url + "/workers", timeout=2).json()["workers"]
            if len(listed) == 2 and all(w["is_healthy"] for w in listed):
                return rp.url
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        assert time.monotonic() < deadline, f"the router did not register both workers:\n{rp.log_tail()}"
        time.sleep(0.2)


def _counters(url: str) -> dict[str, float]:
    wanted = ("sglang:num_requests_total", "sglang:cached_tokens_total")
    found = {}
    for line in httpx.get(url + "/metrics", timeout=30).text.splitlines():
        name = line.split("{")[0]
        if name in wanted:
            found[name.removeprefix("sglang:").removesuffix("_total")] = float(line.rsplit(" ", 1)[1])
    assert len(found) == len(wanted), f"/metrics lacks one of {wanted}"
    return found


def _served(workers, before: list[dict]) -> list[float]:
    """Requests each worker finished since `before` (a list of _counters per worker)."""
    return [_counters(w.url)["num_requests"] - b["num_requests"] for w, b in zip(workers, before)]


def _generate(url: str, text: str, max_new_tokens: int) -> dict:
    params = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True}
    r = httpx.post(url + "/generate", json={"text": text, "sampling_params": params}, timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200, r.text
    return r.json()


def _together(url: str, texts: list[str], max_new_tokens: int) -> list[dict]:
    """The texts sent at the same moment, one thread each."""
    start = threading.Barrier(len(texts))

    def one(text: str) -> dict:
        start.wait(10)
        return _generate(url, text, max_new_tokens)

    with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
        return list(pool.map(one, texts))


# ---- worker side, without the router ---------------------------------------------------------------
def test_bodies_as_the_router_forwards_them_are_accepted(workers):
    """As sent by the router 0.3.2 (captured), plus data_parallel_rank 0 of its --dp-aware mode."""
    url = workers[0].url
    for rank in ({}, {"data_parallel_rank": 0}):
        r = httpx.post(url + "/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 2},
                                                **ROUTER_GENERATE_DEFAULTS, **rank}, timeout=REQUEST_TIMEOUT_S)
        assert r.status_code == 200, r.text
        chat = {"model": "unknown", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                **ROUTER_CHAT_DEFAULTS, **rank}
        r = httpx.post(url + "/v1/chat/completions", json=chat, timeout=REQUEST_TIMEOUT_S)
        assert r.status_code == 200, r.text
    r = httpx.post(url + "/v1/completions", json={"model": "x", "prompt": "Hi", "max_tokens": 2, "echo": False,
                                                  "no_stop_trim": False, "ignore_eos": False,
                                                  "skip_special_tokens": True, "return_hidden_states": False},
                   timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path,field,value", [
    ("/generate", "return_entropy", True), ("/generate", "background", True), ("/generate", "return_bytes", True),
    ("/v1/chat/completions", "return_hidden_states", True), ("/v1/chat/completions", "stream_reasoning", False),
    ("/generate", "data_parallel_rank", 1), ("/v1/chat/completions", "data_parallel_rank", 1),
])
def test_router_fields_this_server_cannot_honour_are_refused_by_name(workers, path, field, value):
    body = ({"text": "Hello"} if path == "/generate"
            else {"model": "m", "messages": [{"role": "user", "content": "Hi"}]})
    r = httpx.post(workers[0].url + path, json={**body, field: value}, timeout=REQUEST_TIMEOUT_S)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field and field in r.json()["error"]["message"], r.text


def test_get_load_counts_a_running_request(workers):
    url = workers[1].url
    idle = httpx.get(url + "/get_load", timeout=30).json()
    assert idle == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0, "num_pending_tokens": 0}]
    body = {"input_ids": list(range(10, 74)), "stream": True,
            "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
    with httpx.stream("POST", url + "/generate", json=body, timeout=REQUEST_TIMEOUT_S) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data:"))  # running now
        busy = httpx.get(url + "/get_load", timeout=30).json()
        for _ in lines:
            pass
    assert busy[0]["num_reqs"] == 1 and busy[0]["num_tokens"] >= 64, busy
    workers[1].wait_idle()


# ---- through the router ----------------------------------------------------------------------------
def test_router_reaches_every_worker_endpoint(router, workers, model_path):
    model_type = httpx.get(workers[0].url + "/model_info", timeout=30).json()["model_type"]
    for listed in httpx.get(router + "/workers", timeout=30).json()["workers"]:  # from /server_info, /model_info
        meta = listed["metadata"]
        assert (meta["model_path"], meta["tp_size"], meta["dp_size"]) == (model_path, "1", "1"), listed
        assert meta["model_type"] == model_type and listed["model_id"] == os.path.basename(model_path), listed
    models = httpx.get(router + "/v1/models", timeout=30).json()  # the served name: the model folder's name
    assert models["data"][0]["id"] == os.path.basename(model_path)
    assert httpx.get(router + "/get_model_info", timeout=30).json()["model_path"] == model_path
    loads = httpx.get(router + "/get_loads", timeout=30).json()["workers"]  # the workers' /get_load
    assert sorted(w["worker"] for w in loads) == sorted(w.url for w in workers)
    assert all(w["load"] >= 0 for w in loads), f"a worker's /get_load did not parse in the router: {loads}"
    flushed = httpx.post(router + "/flush_cache", timeout=30)
    assert flushed.status_code == 200 and flushed.json()["workers_flushed"] == 2, flushed.text
    assert httpx.get(router + "/health_generate", timeout=30).status_code == 200
    metrics = httpx.get(router + "/engine_metrics", timeout=30).text  # the workers' /metrics, merged
    assert all(f'worker_addr="{w.url}"' in metrics for w in workers)


def test_router_serves_every_api_streamed_or_not(router):
    for stream in (False, True):
        bodies = [("/generate", {"text": "Hello", "stream": stream, "sampling_params": {"max_new_tokens": 3}}),
                  ("/v1/completions", {"model": "m", "prompt": "Hello", "max_tokens": 3, "stream": stream}),
                  ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                                            "max_tokens": 3, "stream": stream})]
        for path, body in bodies:
            r = httpx.post(router + path, json=body, timeout=REQUEST_TIMEOUT_S)
            assert r.status_code == 200, f"{path} stream={stream}: {r.text}"
            if stream:
                assert r.text.rstrip().endswith("data: [DONE]"), r.text
            else:
                assert "error" not in r.json(), r.text


def test_concurrent_requests_are_spread_over_both_workers(router, workers):
    # Prompts with different first characters match nothing the router has seen, so it sends each to
    # the worker with the fewest requests in flight; sent together, they go to both.
    words = ["apple", "Zebra", "quartz", "mountain", "42 is", "Violet", "river", "Kettle"]
    before = [_counters(w.url) for w in workers]
    outs = _together(router, [f"{word} " * 5 for word in words], 24)
    assert all(out["meta_info"]["completion_tokens"] == 24 for out in outs)
    served = _served(workers, before)
    assert sum(served) == len(words) and min(served) >= 1, f"requests per worker: {served}"


def test_a_shared_prefix_goes_back_to_the_worker_that_caches_it(router, workers):
    for w in workers:
        w.wait_idle()  # empty prefix caches: every hit below comes from this test's own requests
    # Both first turns at once, so the router (fewest requests in flight) gives them different workers;
    # a fresh pair if they did not overlap (a busy machine).
    for attempt in range(3):
        documents = [f"[{attempt}] Document A, on routing: " + "requests that share a prefix belong together. " * 6,
                     f"[{attempt}] Document B, on caching: " + "a recurrent state is restored from a snapshot. " * 6]
        before = [_counters(w.url) for w in workers]
        _together(router, [doc + "Question 0?" for doc in documents], 32)
        if _served(workers, before) == [1, 1]:
            break
    home = {}
    for turn in range(1, 5):
        for i, doc in enumerate(documents):
            before = [_counters(w.url) for w in workers]
            out = _generate(router, doc + f"Question {turn}?", 2)
            served = _served(workers, before)
            assert sorted(served) == [0, 1], served
            worker = served.index(1)
            assert home.setdefault(i, worker) == worker, f"document {i} moved from worker {home[i]} to {worker}"
            if turn >= 2:  # the first repeat leaves a snapshot at the branch point; later ones restore it
                assert out["meta_info"]["cached_tokens"] > 0, out["meta_info"]
    assert home[0] != home[1], f"both documents went to worker {home[0]}"
    for w in workers:
        assert _counters(w.url)["cached_tokens"] > 0
