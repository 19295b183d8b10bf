"""The OpenAI-compatible API driven by the official `openai` client: completions and chat,
streaming, n, echo, logprobs, stop, max_tokens, seed, usage, the chat template, errors."""

from __future__ import annotations

import os

import httpx
import openai
import pytest

PROMPT = "The capital of France is Paris. The capital of Germany is"


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def native(url: str, **body) -> dict:
    r = httpx.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_models(client, model, server):
    assert model == os.path.basename(server.model_path)  # the model folder's name, never the filesystem path
    assert client.models.retrieve(model).id == model
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_completion_matches_native_with_exact_usage(client, model, url, tokenizer):
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=10, temperature=0)
    ref = native(url, text=PROMPT, sampling_params={"max_new_tokens": 10, "temperature": 0})
    choice = r.choices[0]
    assert r.object == "text_completion" and choice.text == ref["text"]
    assert choice.finish_reason == ref["meta_info"]["finish_reason"]["type"]
    assert r.usage.prompt_tokens == len(tokenizer.encode(PROMPT))
    assert r.usage.completion_tokens == ref["meta_info"]["completion_tokens"]
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_completion_default_max_tokens_is_16(client, model):
    r = client.completions.create(model=model, prompt=PROMPT, temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"


def test_completion_batch_and_n(client, model, tokenizer):
    prompts = [PROMPT, "Once upon a time"]
    r = client.completions.create(model=model, prompt=prompts, max_tokens=4, n=2, temperature=1.0, seed=3,
                                  extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.usage.prompt_tokens == sum(len(tokenizer.encode(p)) for p in prompts)  # once per prompt, not per n
    assert r.usage.completion_tokens == 16
    ids = client.completions.create(model=model, prompt=[tokenizer.encode(p) for p in prompts], max_tokens=4,
                                    n=2, temperature=1.0, seed=3, extra_body={"ignore_eos": True})
    assert [c.text for c in ids.choices] == [c.text for c in r.choices]  # token-id prompts, same seed


def test_echo_and_logprobs(client, model, url, tokenizer):
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0, echo=True, logprobs=3,
                                  extra_body={"ignore_eos": True})
    choice = r.choices[0]
    n_prompt = len(tokenizer.encode(PROMPT))
    assert choice.text.startswith(PROMPT)
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == n_prompt + 5
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(len(t) <= 3 for t in lp.top_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset)
    ref = native(url, text=PROMPT, sampling_params={"max_new_tokens": 5, "temperature": 0, "ignore_eos": True},
                 return_logprob=True, logprob_start_len=0)
    expected = [x[0] for x in ref["meta_info"]["input_token_logprobs"] + ref["meta_info"]["output_token_logprobs"]]
    assert all((a is None and b is None) or abs(a - b) < 1e-5 for a, b in zip(lp.token_logprobs, expected))
    plain = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=0)
    assert len(plain.choices[0].logprobs.token_logprobs) == 5 and not plain.choices[0].text.startswith(PROMPT)


def test_stop(client, model):
    free = client.completions.create(model=model, prompt=PROMPT, max_tokens=16, temperature=0,
                                     extra_body={"ignore_eos": True}).choices[0].text
    spots = [i for i in range(len(free) // 3, len(free) - 1) if free[i:i + 2].isascii() and free[i:i + 2].isalpha()]
    stop = free[spots[0]: spots[0] + 2]
    r = client.completions.create(model=model, prompt=PROMPT, max_tokens=16, temperature=0, stop=[stop, "@@@@"])
    assert r.choices[0].finish_reason == "stop" and r.choices[0].text == free[: free.index(stop)]


def test_seed_reproducible(client, model):
    def run(seed):
        return client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=1.0, seed=seed,
                                         extra_body={"ignore_eos": True}).choices[0].text

    assert run(11) == run(11)
    assert len({run(11), run(12), run(13)}) > 1


def test_streaming_completion(client, model):
    ref = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == ref.choices[0].text
    assert chunks[-1].choices == []
    streamed, plain = chunks[-1].usage.model_dump(), ref.usage.model_dump()
    for usage in (streamed, plain):  # the streamed request reuses the first one's prompt from the cache
        assert usage.pop("prompt_tokens_details")["cached_tokens"] >= 0
    assert streamed == plain
    assert all(c.usage is None for c in chunks[:-1])
    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finished == [ref.choices[0].finish_reason]


def chat(client, model, **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "system", "content": "Be brief."},
                                                                 {"role": "user", "content": "Hello!"}], **kw)


def test_chat_uses_the_chat_template(client, model, tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    r = chat(client, model, max_tokens=8, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(tokenizer.encode(rendered, add_special_tokens=False))
    same = client.completions.create(model=model, prompt=rendered, max_tokens=8, temperature=0)
    assert r.choices[0].message.content == same.choices[0].text


def test_chat_without_max_tokens_runs_to_the_context_length(client, model):
    r = chat(client, model, temperature=0, extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length"
    assert r.usage.total_tokens == 1024  # the server's --context-length


def test_chat_streaming_n_and_usage(client, model):
    ref = chat(client, model, max_tokens=10, temperature=0, n=2)
    chunks = list(chat(client, model, max_tokens=10, temperature=0, n=2, stream=True,
                       stream_options={"include_usage": True}))
    firsts = {}
    texts = {0: "", 1: ""}
    for c in chunks[:-1]:
        choice = c.choices[0]
        firsts.setdefault(choice.index, choice.delta)
        texts[choice.index] += choice.delta.content or ""
        assert c.object == "chat.completion.chunk" and c.id == chunks[0].id
    assert all(d.role == "assistant" for d in firsts.values())
    assert [texts[0], texts[1]] == [c.message.content for c in ref.choices]
    assert chunks[-1].choices == []
    streamed, plain = chunks[-1].usage.model_dump(), ref.usage.model_dump()
    for usage in (streamed, plain):  # the streamed request reuses the first one's prompt from the cache
        assert usage.pop("prompt_tokens_details")["cached_tokens"] >= 0
    assert streamed == plain


def test_chat_logprobs(client, model):
    r = chat(client, model, max_tokens=6, temperature=0, logprobs=True, top_logprobs=4)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    for entry in content:
        assert len(entry.top_logprobs) == 4
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)  # greedy: the top token
        assert isinstance(entry.bytes, list)
    assert "".join(bytes(e.bytes).decode("utf-8", "replace") for e in content).startswith(
        r.choices[0].message.content[:1])
    streamed = [e for c in chat(client, model, max_tokens=6, temperature=0, logprobs=True, top_logprobs=4,
                                stream=True) if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]


def test_chat_content_parts_and_errors(client, model):
    r = client.chat.completions.create(model=model, max_tokens=3, temperature=0, messages=[
        {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}])
    assert r.usage.completion_tokens <= 3
    with pytest.raises(openai.BadRequestError, match="stream_options"):
        chat(client, model, max_tokens=3, stream_options={"include_usage": True})
    with pytest.raises(openai.BadRequestError, match="context length"):
        chat(client, model, max_tokens=5000)
    with pytest.raises(openai.BadRequestError, match="top_logprobs"):
        chat(client, model, max_tokens=3, logprobs=True, top_logprobs=50)
