"""A server started with --skip-tokenizer-init: /generate works on token ids and returns ids; every
route that needs text gets a 400 that says why, and the server stays up."""

from __future__ import annotations

import httpx
import pytest
from server_process import launch


@pytest.fixture(scope="module")
def bare(model_path, tmp_path_factory):
    srv = launch(model_path, tmp_path_factory.mktemp("bare-logs"), "--skip-tokenizer-init", name="bare")
    yield srv
    srv.stop()


def test_generate_on_token_ids(bare):
    r = httpx.post(bare.url + "/generate", json={"input_ids": [5, 6, 7, 8], "sampling_params": {
        "max_new_tokens": 4, "temperature": 0, "ignore_eos": True}}, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert len(out["output_ids"]) == 4 and out["meta_info"]["completion_tokens"] == 4


@pytest.mark.parametrize("path,body", [
    ("/generate", {"text": "Hello", "sampling_params": {"max_new_tokens": 2}}),
    ("/v1/completions", {"model": "m", "prompt": "Hello", "max_tokens": 2}),
    ("/v1/completions", {"model": "m", "prompt": [5, 6, 7], "max_tokens": 2}),
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}),
    ("/tokenize", {"prompt": "Hello"}),
    ("/detokenize", {"tokens": [5, 6]}),
])
def test_text_routes_say_why(bare, path, body):
    r = httpx.post(bare.url + path, json=body, timeout=60)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "tokenizer" in message or "skip_tokenizer_init" in message, message
    assert httpx.get(bare.url + "/health", timeout=10).status_code == 200
