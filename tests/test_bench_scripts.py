"""Smoke tests of the benchmark scripts on the CPU: bench/offline.py on the bundled tiny model and
bench/serving.py against a real server process; both must finish and report real numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hybrid_sgl.server_args import BUNDLED_MODEL
from tests.server.server_process import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script: str, *args: str, timeout: float = 120) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_offline_reports_decode_prefill_and_step_times(tmp_path):
    out = tmp_path / "offline.json"
    text = _run("offline.py", "--config", BUNDLED_MODEL, "--device", "cpu", "--batch", "1", "--prompt", "8",
                "--output", "4", "--skip-hf", "--out", str(out))
    result = json.loads(out.read_text())
    case = result["ours"]["cases"]["1x8"]
    assert case["status"] == "ok" and case["preemptions"] == 0
    decode, prefill = case["decode"], case["prefill"]
    assert decode["whole_batch"] and decode["steps"] == 3  # 4 tokens: the first comes from the prefill step
    assert decode["tok_s"] > 0 and decode["roofline_fraction"] > 0
    assert decode["forward_ms"] > 0 and decode["step_ms"] >= decode["forward_ms"]
    assert decode["step_max_ms"] >= decode["step_p90_ms"] >= decode["step_ms"] and decode["slow_steps"] <= 3
    assert decode["slow_steps_excess_ms"] >= 0
    assert prefill["tokens"] == 8 and prefill["tok_s"] > 0 and prefill["mfu"] > 0
    assert result["hf"] == {"skipped": "--skip-hf"}
    for heading in ("## Decode", "## Prefill", "## Decode step time", "| 1 | 8 |"):
        assert heading in text


@pytest.fixture(scope="module")
def bundled_server(tmp_path_factory):
    srv = launch(BUNDLED_MODEL, tmp_path_factory.mktemp("bench-server"), name="bench")
    yield srv
    srv.stop()


def test_serving_completes_requests_and_checks_the_plan(bundled_server, tmp_path):
    out = tmp_path / "serving.json"
    text = _run("serving.py", "--base-url", bundled_server.url, "--num-prompts", "4", "--random-input-len", "24",
                "--random-output-len", "6", "--poll-interval", "0.02", "--out", str(out))
    result = json.loads(out.read_text())
    m = result["metrics"]
    assert m["completed"] == 4 and m["failed"] == 0 and m["total_output_tokens"] == 24
    assert m["output_throughput"] > 0 and m["request_throughput"] > 0
    assert m["ttft_ms"]["count"] == 4 and m["itl_ms"]["count"] == 4 * 5
    server = result["server"]
    assert server["max_running_requests"] >= server["peaks"].get("num_running_reqs", 0)
    assert server["preemptions"] == 0
    assert "Pools free after the run:                   yes" in text


def test_cost_model_counts_a_stacked_shared_expert_as_dense(tiny_checkpoint):
    """The shared expert stacked as expert E of [E + 1, ...] is read by every token: dense bytes, not
    one more routed expert."""
    from bench.roofline import model_cost
    from hybrid_sgl.config import ModelConfig
    from hybrid_sgl.runner.model_runner import ModelRunner
    from hybrid_sgl.server_args import ServerArgs
    from hybrid_sgl.testing.tiny_checkpoint import TINY_DIMS, TINY_MOE

    i, h = TINY_MOE["moe_intermediate_size"], TINY_DIMS["hidden_size"]
    costs = {}
    for shared in (i, 48):  # stacked, then its own MLP
        path = tiny_checkpoint("qwen3_next", shared_expert_intermediate_size=shared)
        config = ModelConfig.from_hf(path)
        runner = ModelRunner(ServerArgs(model_path=path, device="cpu", dtype="float32").resolved(), config)
        costs[shared] = model_cost(runner.model, config, runner.plan)
    for cost in costs.values():
        assert cost.expert_bytes == 3 * i * h * 4 and cost.expert_params == 3 * i * h
    stacked, own = costs[i], costs[48]
    # the same model but for the shared expert's width: 48 - 32 columns of gate, up and down per MoE layer
    assert own.dense_matmul_params - stacked.dense_matmul_params == stacked.moe_layers * 3 * (48 - i) * h
    assert own.dense_read_bytes - stacked.dense_read_bytes == stacked.moe_layers * 3 * (48 - i) * h * 4


def test_step_profile_reports_every_case_on_cpu(tmp_path):
    out = tmp_path / "steps.json"
    text = _run("step_profile.py", "--config", BUNDLED_MODEL, "--device", "cpu", "--scale", "0.02", "--steps", "1",
                "--out", str(out))
    cases = json.loads(out.read_text())["cases"]
    assert set(cases) == {"decode b1", "decode b32", "extend 64 after 4k", "prefill 512", "prefill 2k", "prefill 8k",
                          "extend 8x256 after 1k", "prefill 2k with 8 cuts", "verify 4 b1", "verify 4 b32",
                          "prefill 4k", "prefill 4k default cuts", "prefill 8x1k", "prefill 8x1k default cuts"}
    for row in cases.values():
        assert row["off"]["wall_ms"] > 0 and row["off, uncached"]["wall_ms"] > 0
        assert set(row["off"]["host_us_per_layer"]) == {"linear_attention+mlp", "full_attention+mlp"}
    assert "| decode b1 | off |" in text


def test_step_profile_lists_the_host_ops_of_an_eager_step(tmp_path):
    out = tmp_path / "steps.json"
    text = _run("step_profile.py", "--config", BUNDLED_MODEL, "--device", "cpu", "--scale", "0.02", "--steps", "1",
                "--cases", "decode b1", "--host-ops", "3", "--out", str(out))
    ops = json.loads(out.read_text())["cases"]["decode b1"]["off"]["host_ops"]  # aten ops by own CPU time
    assert len(ops) == 3 and all(op[0].startswith("aten::") and op[1] > 0 and op[2] > 0 for op in ops)
    assert [op[1] for op in ops] == sorted((op[1] for op in ops), reverse=True)
    assert "Host ops of decode b1, eager" in text
