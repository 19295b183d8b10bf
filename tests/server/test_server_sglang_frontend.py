"""Real SGLang frontend programs (sgl.RuntimeEndpoint) against the server: gen, select,
fork/join, chat roles, streaming, run_batch. Each result is checked against a direct /generate."""

from __future__ import annotations

import httpx
import pytest
import sglang as sgl

GREEDY = {"max_new_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module")
def backend(server):
    backend = sgl.RuntimeEndpoint(server.url)
    sgl.set_default_backend(backend)
    return backend


def native_text(url: str, text: str, max_new_tokens: int = 8) -> str:
    params = {**GREEDY, "max_new_tokens": max_new_tokens}
    r = httpx.post(url + "/generate", json={"text": text, "sampling_params": params}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["text"]


@sgl.function
def answer(s, question):
    s += "Question: " + question + "\nAnswer:"
    s += sgl.gen("answer", max_tokens=8, temperature=0)


def test_backend_info_and_flush(backend, server):
    assert backend.get_model_name() == server.model_path
    assert backend.get_server_info()["max_total_num_tokens"] > 0
    backend.flush_cache()


def test_gen(backend, url):
    state = answer.run(question="What is two plus two?")
    assert state["answer"] == native_text(url, "Question: What is two plus two?\nAnswer:")
    meta = state.get_meta_info("answer")
    assert meta["completion_tokens"] <= 8 and meta["finish_reason"]["type"] in ("length", "stop")


def test_select(backend, url):
    @sgl.function
    def judge(s):
        s += "The capital of France is Paris. Is that right? Answer:"
        s += sgl.select("verdict", choices=[" yes", " no", " maybe so"])

    state = judge.run()
    meta = state.get_meta_info("verdict")
    scores = meta["normalized_prompt_logprobs"]
    assert state["verdict"] == [" yes", " no", " maybe so"][max(range(3), key=scores.__getitem__)]
    prefix = "The capital of France is Paris. Is that right? Answer:"
    for choice, logprobs in zip([" yes", " no", " maybe so"], meta["input_token_logprobs"]):
        r = httpx.post(url + "/generate", json={"text": prefix + choice, "sampling_params": {"max_new_tokens": 0},
                                                "return_logprob": True, "logprob_start_len": 0}, timeout=60).json()
        full = r["meta_info"]["input_token_logprobs"]
        tail = full[len(full) - len(logprobs):]  # select scored the last tokens of the same prompt
        assert [x[1] for x in tail] == [x[1] for x in logprobs]
        assert all(abs(a[0] - b[0]) < 1e-4 for a, b in zip(tail, logprobs))


def test_fork_join(backend, url):
    @sgl.function
    def branches(s):
        s += "Once upon a time"
        forks = s.fork(2)
        for fork, suffix in zip(forks, [" there was", " in a land"]):
            fork += suffix + sgl.gen("next", max_tokens=6, temperature=0)
        forks.join()
        s["joined"] = [fork["next"] for fork in forks]

    state = branches.run()
    assert state["joined"] == [native_text(url, "Once upon a time there was", 6),
                               native_text(url, "Once upon a time in a land", 6)]


def test_chat_roles(backend, url):
    @sgl.function
    def chat(s, begin_only=False):
        s += sgl.system("You are brief.")
        s += sgl.user("Say hello.")
        if begin_only:
            s += sgl.assistant_begin()
        else:
            s += sgl.assistant(sgl.gen("reply", max_tokens=8, temperature=0))

    state = chat.run()
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant"]
    prompt = chat.run(begin_only=True).text()
    assert "You are brief." in prompt and "Say hello." in prompt
    assert state["reply"] == native_text(url, prompt)


def test_streaming(backend, url):
    state = answer.run(question="Why is the sky blue?", stream=True)
    pieces = list(state.text_iter())
    assert len(pieces) > 2
    final = "".join(pieces)
    assert final == state.text()
    assert final.endswith(native_text(url, "Question: Why is the sky blue?\nAnswer:"))


def test_run_batch(backend):
    questions = ["one", "two", "three", "four"]
    states = answer.run_batch([{"question": q} for q in questions], progress_bar=False)
    assert [s["answer"] for s in states] == [answer.run(question=q)["answer"] for q in questions]
