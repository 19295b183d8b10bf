"""The HTTP server with --tp-size 2 (gloo on CPU): native (plain and regex-constrained) and OpenAI
requests answer with the tokens of a tp 1 engine, /server_info reports the plan, and killing rank 1
ends the server within seconds with the cause in its log."""

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from hybrid_sgl.engine import Engine

sys.path.insert(0, str(Path(__file__).parent / "server"))
from server_process import launch  # noqa: E402

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12] * 4
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
REGEX = {"max_new_tokens": 12, "temperature": 0, "regex": "(yes|no), [0-9]{2}"}


def test_server_tp2_answers_and_exits_when_a_rank_dies(tiny_checkpoint, tmp_path):
    path = tiny_checkpoint("qwen3_5")
    with Engine(model_path=path, device="cpu", dtype="float32", chunked_prefill_size=64, context_length=1024,
                log_level="warning") as engine:
        expected = [engine.generate(input_ids=PROMPT, sampling_params=p)["output_ids"] for p in (GREEDY, REGEX)]
    server = launch(path, tmp_path, "--tp-size", "2", "--device", "cpu")
    try:
        info = httpx.get(server.url + "/server_info", timeout=30).json()
        assert info["tp_size"] == 2 and info["max_total_num_tokens"] > 0
        for params, ids in zip((GREEDY, REGEX), expected):
            out = httpx.post(server.url + "/generate", json={"input_ids": PROMPT, "sampling_params": params},
                             timeout=60).json()
            assert out["output_ids"] == ids
            assert "regex" not in params or re.fullmatch(params["regex"], out["text"])
        chat = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
            "model": path, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 6, "temperature": 0})
        assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] > 0
        children = subprocess.run(["pgrep", "-P", str(server.process.pid)], capture_output=True, text=True).stdout
        ranks = [pid for pid in children.split() if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
        assert len(ranks) == 1  # rank 1 (multiprocessing's resource tracker is the other child)
        killed = time.monotonic()
        subprocess.run(["kill", "-9", ranks[0]], check=True)
        server.process.wait(timeout=10)
        assert time.monotonic() - killed < 10 and server.process.returncode != 0
        assert "tensor-parallel rank 1" in server.log_tail() and "exits" in server.log_tail()
    finally:
        server.stop()
