"""The bundled default model (configs/default-model, trained by tools/default_model): a genuine HF
Qwen3.5 hybrid checkpoint that HF transformers and our Engine decode identically, served by the
launcher's default start-up, writing real words (the words of its training text)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import httpx
import pytest
import torch

from tests.server.server_process import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKPOINT = os.path.join(ROOT, "configs", "default-model")
WORDS_FILE = os.path.join(ROOT, "tools", "default_model", "corpus_words.txt")
PROMPTS = ["ROMEO:\n", "HAMLET:\nTo be, or not to be", "In the beginning God created", "The king said",
           "Once upon a time"]
GREEDY_TOKENS = 64
MIN_REAL_WORD_FRACTION = 0.8
STARTUP_TIMEOUT_S = 120

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(CHECKPOINT, "model.safetensors")),
    reason="configs/default-model/model.safetensors is absent: train it with tools/default_model (README there)")


def real_word_fraction(text: str) -> tuple[float, int]:
    """(fraction of the words in `text` that occur in the training text, number of words)."""
    with open(WORDS_FILE) as f:
        known = set(f.read().split())
    words = [w.lower().strip("'") for w in re.findall(r"[A-Za-z']+", text)]
    words = [w for w in words if w]
    return sum(w in known for w in words) / max(1, len(words)), len(words)


def assert_real_words(text: str, min_words: int = 3) -> None:
    fraction, count = real_word_fraction(text)
    assert count >= min_words and fraction >= MIN_REAL_WORD_FRACTION, (fraction, count, text)


@pytest.fixture(scope="module")
def hf_model():
    import transformers as tf

    return tf.AutoModelForCausalLM.from_pretrained(CHECKPOINT, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine():
    from hybrid_sgl import Engine

    eng = Engine(model_path=CHECKPOINT, dtype="float32", device="cpu", chunked_prefill_size=64, log_level="warning")
    yield eng
    eng.check_integrity()
    eng.shutdown()


def test_checkpoint_is_a_small_qwen3_5_hybrid():
    with open(os.path.join(CHECKPOINT, "config.json")) as f:
        config = json.load(f)
    assert config["architectures"] == ["Qwen3_5ForCausalLM"]
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + [
        "full_attention"]
    assert os.path.getsize(os.path.join(CHECKPOINT, "model.safetensors")) <= 25_000_000
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "TRAINING.md"):
        assert os.path.exists(os.path.join(CHECKPOINT, name)), name


def test_greedy_64_tokens_match_hf(engine, hf_model):
    for prompt in PROMPTS:
        ids = engine.tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            ref = hf_model.generate(ids, max_new_tokens=GREEDY_TOKENS, do_sample=False)[0, ids.shape[1]:].tolist()
        out = engine.generate(prompt, {"temperature": 0, "max_new_tokens": GREEDY_TOKENS})
        assert out["output_ids"] == ref, prompt
        assert_real_words(out["text"])


def test_chat_template_reply_stops_with_real_words(engine):
    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Good morrow, my lord."}],
                                                  add_generation_prompt=True, tokenize=False)
    out = engine.generate(prompt, {"temperature": 0, "max_new_tokens": GREEDY_TOKENS})
    assert out["text"].strip()
    assert_real_words(out["text"], min_words=2)


def launch_default_server(log_path: str) -> tuple[subprocess.Popen, str]:
    """The launcher as a user starts it: no --model-path (a free port, quiet logs)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "hybrid_sgl.launch_server", "--port", str(port),
                                    "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    with open(log_path) as f:
        raise RuntimeError(f"default server did not come up:\n{f.read()[-3000:]}")


@pytest.fixture(scope="module")
def default_server(tmp_path_factory):
    process, url = launch_default_server(str(tmp_path_factory.mktemp("default-server") / "server.log"))
    yield url
    process.terminate()
    process.wait(30)


def test_default_server_serves_it(default_server):
    info = httpx.get(default_server + "/get_model_info", timeout=30).json()
    assert os.path.realpath(info["model_path"]) == os.path.realpath(CHECKPOINT)


def test_dsl_program_writes_real_words(default_server):
    import sglang as sgl

    @sgl.function
    def scene(s, speaker):
        s += speaker + ":\n" + sgl.gen("line", max_tokens=32, temperature=0)

    sgl.set_default_backend(sgl.RuntimeEndpoint(default_server))
    state = scene.run(speaker="KING HENRY V")
    assert state["line"].strip()
    assert_real_words(state["line"])


def test_openai_chat_writes_real_words(default_server):
    import openai

    client = openai.OpenAI(base_url=default_server + "/v1", api_key="-", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": "Good morrow, sweet friend. How dost thou?"}]
    r = client.chat.completions.create(model=client.models.list().data[0].id, messages=messages, max_tokens=48,
                                       temperature=0)
    text = r.choices[0].message.content
    assert text.strip()
    assert_real_words(text, min_words=2)
