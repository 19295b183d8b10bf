"""The launcher: --help names every flag (SGLang's spellings too), a launch command copied from SGLang's
docs serves, what cannot run fails in seconds with what to change (busy port, missing weights, a CPU
asked for Triton kernels), start-up logs the device, dtype, plans and URL, --api-key guards the API
(401 without the bearer token), Ctrl-C shuts down cleanly."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
import torch
from server_process import launch

FLAGS = ["--model-path", "--tokenizer-path", "--host", "--port", "--dtype", "--device", "--context-length",
         "--mem-fraction-static", "--max-running-requests", "--max-total-tokens", "--chunked-prefill-size",
         "--page-size", "--attention-backend", "--load-format", "--tp-size", "--served-model-name", "--random-seed",
         "--log-level", "--api-key"]
SGLANG_FLAGS = ["--model", "--tensor-parallel-size", "--dp-size", "--trust-remote-code", "--enable-metrics",
                "--disable-radix-cache", "--chat-template", "--tool-call-parser", "--reasoning-parser",
                "--quantization", "--kv-cache-dtype", "--schedule-policy", "--max-prefill-tokens", "--grammar-backend",
                "--max-mamba-cache-size"]
# SGLang's docs for a Qwen3.5 model, with our model path and a free port
SGLANG_QWEN35 = ["--tp-size", "1", "--mem-fraction-static", "0.8", "--trust-remote-code", "--dtype", "half",
                 "--attention-backend", "flashinfer", "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25"]
KEY = "sk-test-123"
FAIL_FAST_S = 30  # python + torch import on a loaded CI machine; a model build would take far longer


def run_launcher(*flags: str, env: dict | None = None) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "hybrid_sgl.launch_server", *flags], capture_output=True, text=True,
                         timeout=120, env=env)
    return out, time.monotonic() - t0


def test_help_lists_every_flag():
    out, _ = run_launcher("--help")
    assert out.returncode == 0
    for flag in FLAGS + SGLANG_FLAGS:
        assert flag in out.stdout, flag
    assert "No remote code ever runs here" in " ".join(out.stdout.split())


def test_bad_flag_value_is_a_clear_error(model_path):
    out, seconds = run_launcher("--model-path", model_path, "--tp-size", "3")  # 4 attention heads
    assert out.returncode == 2 and "does not split over --tp-size 3" in out.stderr and seconds < FAIL_FAST_S
    out, seconds = run_launcher("--model-path", model_path, "--dp-size", "2")
    assert out.returncode == 2 and "use --dp-size 1" in out.stderr and seconds < FAIL_FAST_S


def test_sglang_docs_command_serves(model_path, tmp_path):
    srv = launch(model_path, tmp_path, *SGLANG_QWEN35, "--log-level", "info", name="sglang-docs")
    try:
        # (ignore_eos: a sampled end of text would end the answer early, at random)
        r = httpx.post(srv.url + "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 2,
                                                                                       "ignore_eos": True}})
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 2
    finally:
        srv.stop()
    log = srv.log_tail(300)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert f"--attention-backend flashinfer is SGLang's name; the closest backend here on {device}" in log
    assert "in float16 on " + device in log


def test_busy_port_fails_before_loading(model_path):
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        out, seconds = run_launcher("--model-path", model_path, "--port", str(port))
    assert out.returncode == 2 and seconds < FAIL_FAST_S
    assert f"cannot bind 127.0.0.1:{port}" in out.stderr and "choose another --port" in out.stderr
    assert "loading weights" not in out.stderr


def test_missing_weights_fail_at_once(model_path, tmp_path):
    for name in os.listdir(model_path):
        if not name.endswith(".safetensors"):
            shutil.copy(os.path.join(model_path, name), tmp_path / name)
    out, seconds = run_launcher("--model-path", str(tmp_path))
    assert out.returncode == 2 and seconds < FAIL_FAST_S
    assert "no weights" in out.stderr and "--load-format dummy" in out.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a CPU machine")
def test_triton_on_cpu_fails_at_start_up(model_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out, seconds = run_launcher("--model-path", model_path, "--linear-attn-backend", "triton", env=env)
    assert out.returncode == 2 and seconds < FAIL_FAST_S
    assert "--linear-attn-backend triton needs a CUDA GPU" in out.stderr and "--linear-attn-backend torch" in out.stderr


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
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert "in float32 on " + device in log  # the device and dtype
    assert "loading weights: " in log and "\r" not in log  # progress as log lines, no bar
    assert "Traceback" not in log
