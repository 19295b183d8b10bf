"""Errors and log hygiene: /flush_cache while busy answers in OpenAI's error shape, /v1/models names
the served model (not a filesystem path), /openapi.json builds without warnings, a bad grammar
leaves no unread future exception behind, and the scheduler's batch lines (SGLang's wording) appear
at --log-level info and not at warning; the access log only with --enable-access-log."""

from __future__ import annotations

import gc
import logging
import os
import re
import threading
import time
import warnings

import httpx
import pytest
from server_process import launch
from starlette.testclient import TestClient

from hybrid_sgl.engine import Engine
from hybrid_sgl.server.app import create_app
from hybrid_sgl.server_args import ServerArgs

PREFILL = re.compile(r"Prefill batch\. #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+), "
                     r"token usage: \d+\.\d\d, #running-req: (\d+), #queue-req: (\d+)$")
DECODE = re.compile(r"Decode batch\. #running-req: (\d+), #token: (\d+), token usage: \d+\.\d\d, "
                    r"gen throughput \(token/s\): \d+\.\d\d, #queue-req: (\d+)$")
STEP_LOGGER = "hybrid_sgl.scheduler.step_log"
INTERVAL = 4


@pytest.fixture(scope="module")
def engine(model_path):
    level = logging.getLogger("hybrid_sgl").level
    eng = Engine(model_path=model_path, dtype="float32", device="cpu", chunked_prefill_size=16,
                 max_running_requests=8, decode_log_interval=INTERVAL, log_level="info")
    yield eng
    eng.shutdown()
    logging.getLogger("hybrid_sgl").setLevel(level)


@pytest.fixture(scope="module")
def client(engine):
    with TestClient(create_app(engine)) as c:
        yield c


def _step_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == STEP_LOGGER]


# ---- errors ----------------------------------------------------------------------------------------
def test_flush_cache_while_busy_is_an_openai_error(engine, client):
    params = {"max_new_tokens": 900, "ignore_eos": True, "temperature": 0}
    worker = threading.Thread(target=engine.generate, args=("Once upon a time", params), kwargs={"rid": "busy"})
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while engine.stats()["num_running_reqs"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        r = client.post("/flush_cache")
    finally:
        engine.abort("busy")
        worker.join()
    assert r.status_code == 400 and r.headers["content-type"] == "application/json", r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "server_busy" and error["param"] is None
    assert "not flushed" in error["message"]
    ok = client.get("/flush_cache")
    assert ok.status_code == 200 and ok.text == "Cache flushed.\n"  # SGLang's answer when it flushes


def test_models_name_the_served_model_not_the_path(engine, client, model_path):
    name = os.path.basename(os.path.normpath(model_path))
    assert engine.server_args.served_model_name == name
    listed = client.get("/v1/models")
    assert model_path not in listed.text  # no filesystem path, as SGLang's card (root = the served name)
    models = listed.json()["data"]
    assert [m["id"] for m in models] == [name] and models[0]["root"] == name
    assert client.get(f"/v1/models/{name}").json()["id"] == name
    assert client.get("/model_info").json()["served_model_name"] == name
    r = client.post("/v1/completions", json={"model": name, "prompt": "Hi", "max_tokens": 1})
    assert r.status_code == 200 and r.json()["model"] == name, r.text
    given = ServerArgs(model_path=model_path, served_model_name="tiny-hybrid", load_format="dummy").resolved()
    assert given.served_model_name == "tiny-hybrid"


def test_openapi_has_unique_operation_ids(engine):
    app = create_app(engine)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # FastAPI warns on a duplicate operation id
        spec = app.openapi()
    ids = [op["operationId"] for path in spec["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids))
    assert {"post", "put"} <= set(spec["paths"]["/generate"]) and {"get", "post"} <= set(spec["paths"]["/flush_cache"])


def test_a_bad_grammar_leaves_no_unread_future_exception(engine, client, monkeypatch, caplog):
    """The compile's failure reaches the route as a 400 and nothing is left for asyncio to report
    when the futures are collected (at shutdown, when the grammar cache goes)."""
    cache = engine.scheduler.grammars
    compile_now = cache.backend.compile

    def slow_compile(key):  # still compiling when the route starts waiting for it
        time.sleep(0.2)
        return compile_now(key)

    monkeypatch.setattr(cache.backend, "compile", slow_compile)
    body = {"text": "Hi", "sampling_params": {"regex": "(((unclosed-hygiene", "max_new_tokens": 2}}
    r = client.post("/generate", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "regex", r.text
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        with cache._lock:
            cache._futures.clear()  # what shutdown does to the cached compiles
        gc.collect()
    assert "never retrieved" not in caplog.text


# ---- the batch lines -------------------------------------------------------------------------------
def test_prefill_and_decode_lines_at_info(engine, caplog):
    caplog.set_level(logging.INFO)
    prompts = ["The capital of France is Paris. The capital of Germany is", "Once upon a time"]
    outs = engine.generate(prompts, {"max_new_tokens": 12, "ignore_eos": True, "temperature": 0})
    lines = _step_lines(caplog)
    prefills = [m for m in map(PREFILL.match, lines) if m]
    decodes = [m for m in map(DECODE.match, lines) if m]
    assert prefills and decodes, lines
    assert len(prefills) + len(decodes) == len(lines), lines  # nothing else, nothing malformed
    prompt_tokens = sum(o["meta_info"]["prompt_tokens"] - o["meta_info"]["cached_tokens"] for o in outs)
    assert sum(int(m.group(2)) for m in prefills) >= prompt_tokens  # chunks of 16 cover every prompt token
    assert all(int(m.group(2)) <= 16 for m in prefills)
    assert all(1 <= int(m.group(1)) <= 2 and int(m.group(2)) > 0 for m in decodes)


def test_no_batch_lines_at_warning(engine, caplog):
    caplog.set_level(logging.INFO)
    logging.getLogger("hybrid_sgl").setLevel(logging.WARNING)  # what --log-level warning sets
    try:
        engine.generate("Hello there", {"max_new_tokens": 2 * INTERVAL + 1, "ignore_eos": True})
    finally:
        logging.getLogger("hybrid_sgl").setLevel(logging.INFO)
    assert _step_lines(caplog) == []


def test_the_server_log_at_warning_has_no_info_lines(server):
    """The shared server runs with --log-level warning: neither our loggers nor uvicorn write info."""
    assert httpx.post(server.url + "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 3}},
                      timeout=60).status_code == 200
    log = server.log_tail(400)
    for marker in ("Prefill batch", "Decode batch", "INFO:", "serving ", "memory plan"):
        assert marker not in log, log


def test_the_server_log_at_info_with_the_access_log(model_path, tmp_path_factory):
    srv = launch(model_path, tmp_path_factory.mktemp("info-logs"), "--log-level", "info", "--decode-log-interval",
                 "2", "--enable-access-log", name="info")
    try:
        # ignore_eos: a sampled end of text after the first token would leave no decode step to log
        body = {"text": "Hi", "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}}
        r = httpx.post(srv.url + "/generate", json=body, timeout=60)
        assert r.status_code == 200
        time.sleep(0.2)
        log = srv.log_tail(400)
    finally:
        srv.stop()
    assert "Prefill batch. #new-seq: 1" in log and "Decode batch. #running-req: 1" in log, log
    assert '"POST /generate HTTP/1.1" 200' in log, log
