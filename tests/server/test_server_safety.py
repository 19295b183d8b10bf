"""Safe by default: no CORS headers unless --allowed-origins asks, a web page cannot start work
through a simple cross-site request, exactly one Authorization header, a 5xx closes the
connection, huge inputs are refused before they are tokenized and never stall /health; also
/metrics (SGLang's names, the served name not the path), /openapi.json and /docs, /v1/models/default
and the default max_new_tokens clipped to the context."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families
from server_process import CONTEXT, launch
from starlette.testclient import TestClient

from hybrid_sgl.server.errors import install_error_handlers
from hybrid_sgl.server.guards import RequestGuard
from hybrid_sgl.server.metrics import public_model_name

KEY = "sk-safety"
ORIGIN = "http://allowed.example"


@pytest.fixture(scope="module")
def guarded(model_path, tmp_path_factory):
    srv = launch(model_path, tmp_path_factory.mktemp("guarded-logs"), "--api-key", KEY, "--allowed-origins",
                 ORIGIN, name="guarded")
    yield srv
    srv.stop()


def test_no_cors_headers_by_default(url):
    r = httpx.post(url + "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 1}},
                   headers={"origin": "http://evil.example"})
    assert r.status_code == 200 and not [h for h in r.headers if h.startswith("access-control")]
    pre = httpx.options(url + "/generate", headers={"origin": "http://evil.example",
                                                    "access-control-request-method": "POST"})
    assert "access-control-allow-origin" not in pre.headers


def test_simple_cross_site_requests_are_refused_and_curl_works(url):
    body = b'{"text": "Hi", "sampling_params": {"max_new_tokens": 1}}'
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
        r = httpx.post(url + "/generate", content=body, headers={"origin": "http://evil.example",
                                                                 "content-type": ctype})
        assert r.status_code == 415 and "application/json" in r.json()["error"]["message"], r.text
    curl = httpx.post(url + "/generate", content=body, headers={"content-type": "application/x-www-form-urlencoded"})
    assert curl.status_code == 200


def test_allowed_origin_gets_cors_and_the_key_is_still_required(guarded):
    headers = {"origin": ORIGIN, "access-control-request-method": "POST",
               "access-control-request-headers": "authorization,content-type"}
    pre = httpx.options(guarded.url + "/v1/completions", headers=headers)
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.options(guarded.url + "/v1/completions", headers={**headers, "origin": "http://evil.example"})
    assert other.headers.get("access-control-allow-origin") != "http://evil.example"
    body = {"prompt": "Hi", "max_tokens": 1}
    r = httpx.post(guarded.url + "/v1/completions", json=body, headers={"origin": ORIGIN})
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ORIGIN
    ok = httpx.post(guarded.url + "/v1/completions", json=body,
                    headers={"origin": ORIGIN, "authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200


def test_exactly_one_authorization_header(guarded):
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 1}}
    good = ("authorization", f"Bearer {KEY}")
    for headers in ([("authorization", "Bearer wrong"), good], [good, ("authorization", "Bearer x")]):
        r = httpx.post(guarded.url + "/generate", json=body, headers=headers)
        assert r.status_code == 401 and "exactly one" in r.json()["error"]["message"], r.text
    assert httpx.post(guarded.url + "/generate", json=body, headers=[good]).status_code == 200
    # sglang-router with --api-key forwards the client's header and adds its own, the same one
    assert httpx.post(guarded.url + "/generate", json=body, headers=[good, good]).status_code == 200


def test_a_5xx_closes_the_connection():
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom():
        raise RuntimeError("engine fault")

    app.add_middleware(RequestGuard, max_body_bytes=1 << 20, api_key=None)
    with TestClient(app, raise_server_exceptions=False) as client:
        r = client.get("/boom")
    assert r.status_code == 500 and r.headers["connection"] == "close"
    assert r.json()["error"]["type"] == "internal_server_error"


def test_huge_prompts_are_refused_untokenized_and_health_stays_fast(url):
    huge = "word " * 2_000_000  # 10 MB

    async def run() -> tuple[list[httpx.Response], float]:
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            posts = [asyncio.ensure_future(c.post(path, json=body)) for path, body in [
                ("/generate", {"text": huge}), ("/v1/completions", {"prompt": huge}),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": huge}]}),
                ("/tokenize", {"prompt": huge})]]
            worst = 0.0
            while not all(p.done() for p in posts):
                t = time.perf_counter()
                assert (await c.get("/health")).status_code == 200
                worst = max(worst, time.perf_counter() - t)
                await asyncio.sleep(0.01)
            return [p.result() for p in posts], worst

    t0 = time.perf_counter()
    responses, worst_health = asyncio.run(run())
    for r in responses:
        assert r.status_code == 400 and "characters" in r.json()["error"]["message"], r.text[:300]
    assert time.perf_counter() - t0 < 20 and worst_health < 2.0, worst_health


def test_metrics_use_sglang_names_and_the_served_name(url, server):
    httpx.post(url + "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 3}})
    text = httpx.get(url + "/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("num_running_reqs", "num_queue_reqs", "token_usage", "mamba_usage", "cache_hit_rate",
                 "num_retracted_reqs", "max_total_num_tokens", "context_len", "gen_throughput", "prompt_tokens",
                 "generation_tokens", "cached_tokens", "num_requests", "num_aborted_requests",
                 "time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                 "queue_time_seconds"):
        assert f"sglang:{name}" in families, name
    labels = {s.labels.get("model_name") for f in families.values() for s in f.samples}
    assert labels == {public_model_name(server.model_path, server.model_path)}
    assert server.model_path not in text  # never the filesystem path
    assert families["sglang:context_len"].samples[0].value == CONTEXT
    counts = {s.name: s.value for f in families.values() for s in f.samples if s.name.endswith("_count")}
    assert counts["sglang:queue_time_seconds_count"] >= 1 and counts["sglang:inter_token_latency_seconds_count"] >= 1


def test_openapi_and_docs_come_from_the_request_models(url):
    spec = httpx.get(url + "/openapi.json").json()
    body = spec["paths"]["/generate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/GenerateRequest"}
    fields = spec["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert {"messages", "max_completion_tokens", "top_logprobs"} <= set(fields)
    assert "swagger" in httpx.get(url + "/docs").text.lower()


def test_models_route_answers_for_default(url):
    r = httpx.get(url + "/v1/models/default")
    assert r.status_code == 200 and r.json()["object"] == "model", r.text
    assert httpx.get(url + "/v1/models/other").status_code == 404


def test_default_max_new_tokens_is_clipped_to_the_context(url):
    prompt = [5] * (CONTEXT - 10)
    r = httpx.post(url + "/generate", json={"input_ids": prompt, "sampling_params": {"ignore_eos": True}}, timeout=60)
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 10, r.text[:300]
    r = httpx.post(url + "/generate", json={"input_ids": prompt, "sampling_params": {"max_new_tokens": 11}})
    assert r.status_code == 400 and "context length" in r.json()["error"]["message"]
