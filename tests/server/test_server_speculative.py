"""Speculative decoding through the server: the same greedy text as a server without it, on the native
and OpenAI routes, streaming too; spec_verify_ct in meta_info, the mean accept length in /server_info
and /metrics; a checkpoint without an MTP layer refuses the flag at start with status 2."""

from __future__ import annotations

import json

import httpx
import pytest
from server_process import free_port, launch

SPEC = ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3")


@pytest.fixture(scope="module")
def mtp_path(tiny_checkpoint):
    return tiny_checkpoint("qwen3_5", mtp=True)


@pytest.fixture(scope="module")
def spec_server(mtp_path, tmp_path_factory):
    srv = launch(mtp_path, tmp_path_factory.mktemp("spec-logs"), *SPEC, name="spec")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def plain_server(mtp_path, tmp_path_factory):
    srv = launch(mtp_path, tmp_path_factory.mktemp("plain-logs"), name="plain")
    yield srv
    srv.stop()


def _generate(url: str, stream: bool = False) -> dict:
    body = {"text": "Hybrid models mix attention", "stream": stream,
            "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}}
    r = httpx.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    if not stream:
        return r.json()
    chunks = [json.loads(line[len("data: "):]) for line in r.text.splitlines()
              if line.startswith("data: ") and line != "data: [DONE]"]
    return chunks[-1]


def test_greedy_text_equals_the_plain_server_and_reports_verify_steps(spec_server, plain_server):
    want = _generate(plain_server.url)
    got = _generate(spec_server.url)
    assert got["text"] == want["text"] and got["output_ids"] == want["output_ids"]
    assert 0 < got["meta_info"]["spec_verify_ct"] <= 16
    assert "spec_verify_ct" not in want["meta_info"]
    assert _generate(spec_server.url, stream=True)["text"] == want["text"]
    body = {"model": "default", "prompt": "Hybrid models mix attention", "max_tokens": 16, "temperature": 0}
    a = httpx.post(plain_server.url + "/v1/completions", json=body, timeout=120).json()
    b = httpx.post(spec_server.url + "/v1/completions", json=body, timeout=120).json()
    assert b["choices"][0]["text"] == a["choices"][0]["text"]
    info = httpx.get(spec_server.url + "/server_info", timeout=30).json()
    assert info["speculative_algorithm"] == "NEXTN" and info["internal_states"][0]["avg_spec_accept_length"] >= 1.0
    metrics = httpx.get(spec_server.url + "/metrics", timeout=30).text
    assert any(line.startswith("sglang:spec_accept_length{") for line in metrics.splitlines())


def test_a_checkpoint_without_an_mtp_layer_refuses_the_flag(model_path):
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "hybrid_sgl.launch_server", "--model-path", model_path, "--device", "cpu",
           "--port", str(free_port()), *SPEC]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "has none" in run.stderr, run.stderr[-2000:]
