"""The launcher: --help names every flag, start-up logs the plans and the URL, --api-key guards the
API (401 without the bearer token), Ctrl-C shuts down cleanly."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import openai
import pytest
from server_process import launch

FLAGS = ["--model-path", "--tokenizer-path", "--host", "--port", "--dtype", "--device", "--context-length",
         "--mem-fraction-static", "--max-running-requests", "--max-total-tokens", "--chunked-prefill-size",
         "--page-size", "--attention-backend", "--load-format", "--tp-size", "--served-model-name", "--random-seed",
         "--log-level", "--api-key"]
KEY = "sk-test-123"


def test_help_lists_every_flag():
    out = subprocess.run([sys.executable, "-m", "hybrid_sgl.launch_server", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0
    for flag in FLAGS:
        assert flag in out.stdout, flag


def test_bad_flag_value_is_a_clear_error():
    out = subprocess.run([sys.executable, "-m", "hybrid_sgl.launch_server", "--tp-size", "2"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode != 0 and "tp_size" in out.stderr


@pytest.fixture(scope="module")
def keyed(model_path, tmp_path_factory):
    srv = launch(model_path, tmp_path_factory.mktemp("keyed-logs"), "--api-key", KEY, "--served-model-name",
                 "tiny-hybrid", "--log-level", "info", name="keyed")
    yield srv
    srv.stop()


def test_api_key(keyed):
    body = {"text": "Hi", "sampling_params": {"max_new_tokens": 2}}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        r = httpx.post(keyed.url + "/generate", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(keyed.url + "/v1/models").status_code == 401
    assert httpx.get(keyed.url + "/server_info").status_code == 401
    good = {"Authorization": f"Bearer {KEY}"}
    assert httpx.post(keyed.url + "/generate", json=body, headers=good).status_code == 200
    assert httpx.get(keyed.url + "/server_info", headers=good).json()["api_key"] != KEY  # never echoed back
    assert httpx.get(keyed.url + "/health").status_code == 200  # open, as in SGLang
    assert httpx.get(keyed.url + "/metrics").status_code == 200


def test_api_key_with_openai_client(keyed):
    good = openai.OpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
    r = good.completions.create(model="tiny-hybrid", prompt="Hi", max_tokens=2)
    assert r.model == "tiny-hybrid" and r.usage.completion_tokens <= 2
    assert [m.id for m in good.models.list().data] == ["tiny-hybrid"]
    bad = openai.OpenAI(base_url=keyed.url + "/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="tiny-hybrid", prompt="Hi", max_tokens=2)


def test_startup_log_and_clean_ctrl_c(keyed):
    # a request in flight when Ctrl-C arrives must not keep the server from exiting
    client = httpx.Client(timeout=30)
    with client.stream("POST", keyed.url + "/generate", headers={"Authorization": f"Bearer {KEY}"},
                       json={"text": "Hi", "stream": True,
                             "sampling_params": {"max_new_tokens": 1000, "ignore_eos": True}}) as r:
        next(r.iter_lines())
        t0 = time.monotonic()
        code = keyed.stop()
    assert code == 0 and time.monotonic() - t0 < 15
    log = keyed.log_tail(200)
    assert "memory plan" in log and "layer   0" in log and keyed.url in log
    assert "Traceback" not in log
