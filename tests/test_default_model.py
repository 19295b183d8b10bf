"""The bundled default model (configs/default-model, trained by tools/default_model): a genuine HF
Qwen3.5 hybrid checkpoint that HF transformers and our Engine decode identically, served by the
launcher's default start-up, writing real words (the words of its training text). Its chat template
is the ChatML it was trained on, plus `tools` in Qwen3's <tool_call> format, so forced tool calls
work without --tool-call-parser."""

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
TEMPLATE_COPIES = [os.path.join(ROOT, "tools", "default_model", "chat_template.jinja"),
                   os.path.join(ROOT, "tools", "default_model", "tokenizer", "chat_template.jinja"),
                   os.path.join(CHECKPOINT, "chat_template.jinja")]
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The forecast for a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}]
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
    assert config["mtp_num_hidden_layers"] == 1  # the draft layer of --speculative-algorithm NEXTN
    # 11.5 M parameters of the model and 1.4 M of its MTP layer, in bf16
    assert os.path.getsize(os.path.join(CHECKPOINT, "model.safetensors")) <= 26_000_000
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


def test_chat_template_renders_tools_in_qwen3_format():
    from transformers import AutoTokenizer

    from hybrid_sgl.testing.tiny_checkpoint import CHAT_TEMPLATE  # the template before tools were added

    texts = []
    for path in TEMPLATE_COPIES:
        with open(path) as f:
            texts.append(f.read())
    assert texts[0] == texts[1] == texts[2], "the chat template's copies differ"
    tok = AutoTokenizer.from_pretrained(CHECKPOINT)
    conversations = [[{"role": "user", "content": "Good morrow."}],
                     [{"role": "system", "content": "Speak as a king."}, {"role": "user", "content": "Hail!"},
                      {"role": "assistant", "content": "Well met."}, {"role": "user", "content": "And now?"}]]
    for messages in conversations:  # without tools: as before, token for token
        for add in (True, False):
            kwargs = dict(tokenize=False, add_generation_prompt=add)
            assert tok.apply_chat_template(messages, **kwargs) == \
                tok.apply_chat_template(messages, **kwargs, chat_template=CHAT_TEMPLATE)
    messages = conversations[1]
    text = tok.apply_chat_template(messages, tools=[t["function"] for t in TOOLS], tokenize=False,
                                   add_generation_prompt=True)
    system, rest = text.split("<|im_end|>\n", 1)
    assert system.startswith("<|im_start|>system\nSpeak as a king.\n\n")  # the system text, then the tools
    signatures = system.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0].split("\n")
    assert [json.loads(line) for line in signatures] == [t["function"] for t in TOOLS]
    assert '<tool_call>\n{"name": <function-name>, "arguments": ' in system and system.endswith("</tool_call>")
    assert rest == tok.apply_chat_template(messages[1:], tokenize=False, add_generation_prompt=True)
    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                                 "arguments": {"city": "Rome", "days": 2}}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}]
    text = tok.apply_chat_template(history, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n'
            '</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nSunny\n</tool_response><|im_end|>\n') in text


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


def test_forced_tool_calls_without_a_parser_flag(default_server):
    """The template shows <tool_call>: tool_choice required / named take its format (qwen25) with no
    --tool-call-parser, and the call comes back parsed."""
    import jsonschema
    import openai

    client = openai.OpenAI(base_url=default_server + "/v1", api_key="-", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "What weather shall we have in Rome?"}]
    r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, tool_choice="required",
                                       max_tokens=256, temperature=0, parallel_tool_calls=False)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None, choice
    [call] = choice.message.tool_calls
    if call.function.name == "get_weather":
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=256, temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and [c.function.name for c in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)
