"""hybrid_sgl.Engine, the in-process API: SGLang-shaped results, sampling controls, logprobs,
streaming, batching, validation, and greedy equality with HF generate."""

import asyncio
import logging

import pytest
import torch

from hybrid_sgl import Engine


@pytest.fixture(scope="module")
def engine(tiny_checkpoint):
    eng = Engine(model_path=tiny_checkpoint("qwen3_5"), dtype="float32", device="cpu", chunked_prefill_size=16,
                 max_running_requests=8, log_level="warning")
    yield eng
    eng.check_integrity()
    eng.shutdown()


GREEDY = {"temperature": 0, "max_new_tokens": 12}


def test_greedy_matches_hf_generate(engine, tiny_checkpoint):
    import transformers as tf

    path = tiny_checkpoint("qwen3_5")
    hf = tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for prompt in ["The capital of France is", "Hello! How are you today? I am fine"]:
        ids = engine.tokenizer(prompt, return_tensors="pt").input_ids
        ref = hf.generate(ids, max_new_tokens=12, do_sample=False)[0, ids.shape[1]:].tolist()
        out = engine.generate(prompt, GREEDY)
        assert out["output_ids"] == ref
        assert out["meta_info"]["prompt_tokens"] == ids.shape[1]
        assert out["meta_info"]["completion_tokens"] == len(ref)


def test_result_shape_and_batches(engine):
    one = engine.generate("Hello", GREEDY)
    assert set(one) == {"text", "output_ids", "meta_info"}
    meta = one["meta_info"]
    assert {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens"} <= set(meta)
    assert meta["finish_reason"]["type"] in ("stop", "length")
    assert one["text"] == engine.tokenizer.decode(one["output_ids"], skip_special_tokens=True) or \
        meta["finish_reason"]["type"] == "stop"
    batch = engine.generate(["Hello", "The quick brown fox"], GREEDY)
    assert isinstance(batch, list) and len(batch) == 2
    assert batch[0]["output_ids"] == one["output_ids"]
    by_ids = engine.generate(input_ids=engine.tokenizer.encode("Hello"), sampling_params=GREEDY)
    assert by_ids["output_ids"] == one["output_ids"]
    per_prompt = engine.generate(["Hello", "Hello"], [GREEDY, {**GREEDY, "max_new_tokens": 3}])
    assert len(per_prompt[1]["output_ids"]) <= 3


def test_parallel_sampling_and_seeds(engine):
    params = {"temperature": 1.0, "max_new_tokens": 10, "ignore_eos": True}
    outs = engine.generate("Once upon a time", {**params, "n": 3, "seed": 7})
    assert len(outs) == 3
    again = engine.generate("Once upon a time", {**params, "n": 3, "seed": 7})
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in again]
    assert len({tuple(o["output_ids"]) for o in outs}) > 1  # copies are independent draws
    other = engine.generate("Once upon a time", {**params, "seed": 8})
    assert other["output_ids"] != outs[0]["output_ids"]


def test_top_k_one_is_greedy(engine):
    greedy = engine.generate("The sky is", GREEDY)
    top1 = engine.generate("The sky is", {"temperature": 0.8, "top_k": 1, "max_new_tokens": 12})
    assert greedy["output_ids"] == top1["output_ids"]


def test_stop_token_ids_and_stop_strings(engine):
    base = engine.generate("Question: what is two plus two?", {**GREEDY, "ignore_eos": True})
    ids = base["output_ids"]
    stop_id = ids[4]
    cut = engine.generate("Question: what is two plus two?", {**GREEDY, "ignore_eos": True,
                                                              "stop_token_ids": [stop_id]})
    first = ids.index(stop_id)
    assert cut["output_ids"] == ids[: first + 1]
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_id}
    text = base["text"]
    stop = text[len(text) // 2: len(text) // 2 + 3]
    if stop.strip():
        out = engine.generate("Question: what is two plus two?", {**GREEDY, "ignore_eos": True, "stop": stop})
        assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
        assert stop not in out["text"] and text.startswith(out["text"])


def test_min_new_tokens_masks_eos(engine):
    eos = engine.model_config.eos_token_ids[0]
    forced = {"temperature": 0, "max_new_tokens": 8, "logit_bias": {str(eos): 100.0}}
    assert engine.generate("Hi", forced)["output_ids"] == [eos]
    out = engine.generate("Hi", {**forced, "min_new_tokens": 3})
    assert len(out["output_ids"]) == 4 and out["output_ids"][-1] == eos and eos not in out["output_ids"][:3]


def test_logprobs_and_prefill_only(engine):
    prompt = "The capital of France is Paris"
    n = len(engine.tokenizer.encode(prompt))
    for start in (0, 3, n - 1, n):
        out = engine.generate(prompt, {**GREEDY, "max_new_tokens": 4}, return_logprob=True,
                              logprob_start_len=start, top_logprobs_num=2, return_text_in_logprobs=True)
        meta = out["meta_info"]
        assert meta["prompt_tokens"] == start + len(meta["input_token_logprobs"])
        assert len(meta["output_token_logprobs"]) == len(out["output_ids"])
        assert all(len(t) == 2 for t in meta["output_top_logprobs"])
        for (lp, tid, text), top in zip(meta["output_token_logprobs"], meta["output_top_logprobs"]):
            assert tid == top[0][1] and lp == pytest.approx(top[0][0])  # greedy picks the top token
            assert isinstance(text, str)
    first = engine.generate(prompt, {"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
    assert first["output_ids"] == [] and first["meta_info"]["finish_reason"]["type"] == "length"
    assert first["meta_info"]["input_token_logprobs"][0][0] is None
    # decode logprobs equal re-prefill logprobs
    gen = engine.generate(prompt, {**GREEDY, "max_new_tokens": 5}, return_logprob=True)
    ids = engine.tokenizer.encode(prompt)
    again = engine.generate(input_ids=ids + gen["output_ids"], sampling_params={"max_new_tokens": 0},
                            return_logprob=True, logprob_start_len=len(ids))
    decode_lps = [lp for lp, _, _ in gen["meta_info"]["output_token_logprobs"]]
    prefill_lps = [lp for lp, _, _ in again["meta_info"]["input_token_logprobs"]]
    assert prefill_lps == pytest.approx(decode_lps, rel=1e-4, abs=1e-5)


def test_streaming_sync_and_async(engine):
    params = {**GREEDY, "ignore_eos": True}
    full = engine.generate("Hybrid language models", params, return_logprob=True)
    chunks = list(engine.generate("Hybrid language models", params, stream=True, return_logprob=True))
    assert chunks[-1]["text"] == full["text"]
    assert all(a["text"] == b["text"][: len(a["text"])] for a, b in zip(chunks, chunks[1:]))  # cumulative
    streamed = [e for c in chunks for e in c["meta_info"]["output_token_logprobs"]]  # deltas
    want = full["meta_info"]["output_token_logprobs"]
    # the second send restores the first's snapshot (its last prompt position but one): float32 rounding
    assert [e[1:] for e in streamed] == [e[1:] for e in want]
    assert [e[0] for e in streamed] == pytest.approx([e[0] for e in want], rel=1e-5, abs=1e-6)

    async def main():
        result = await engine.async_generate("Hybrid language models", params)
        pieces = [c async for c in await engine.async_generate("Hybrid language models", params, stream=True)]
        return result, pieces

    result, pieces = asyncio.run(main())
    assert result["output_ids"] == full["output_ids"] and pieces[-1]["output_ids"] == full["output_ids"]


def test_abandoned_stream_aborts_and_frees(engine):
    stream = engine.generate("Hello", {"max_new_tokens": 200, "ignore_eos": True}, stream=True)
    next(stream)
    stream.close()
    for _ in range(100):
        stats = engine.stats()
        if stats["num_running_reqs"] == stats["num_waiting_reqs"] == 0:
            break
    assert stats["num_running_reqs"] == stats["num_waiting_reqs"] == 0
    assert stats["num_free_slots"] == stats["num_slots"]
    engine.check_integrity()



def test_serving_surface_returns_plain_data(engine):
    cap = engine.capacity()
    info = engine.server_info()
    assert (cap.context_length, cap.max_total_tokens, cap.max_running_requests) == (
        info["context_length"], info["max_total_num_tokens"], info["max_running_requests"])
    assert cap.vocab_size == engine.model_config.vocab_size and cap.max_prompt_chars > cap.context_length
    stats = engine.stats(check=True)
    assert stats["integrity"] == "ok" and stats["open_sinks"] == 0 and stats["reserved_rids"] == 0
    assert stats["num_running_reqs"] == stats["num_waiting_reqs"] == stats["num_compiling_reqs"] == 0
    assert asyncio.run(engine.async_stats()).keys() == engine.stats().keys() == stats.keys() - {
        "integrity", "open_sinks", "reserved_rids"}
    assert asyncio.run(engine.async_flush_cache()) is True

    def prepared(params):
        return engine.prepare("Hello", {**GREEDY, **params}, None, False, None, None, False, None)[0]

    assert asyncio.run(engine.grammar_ready(prepared({}))) is None
    assert asyncio.run(engine.grammar_ready(prepared({"regex": "(yes|no)"}))) is None
    field, message = asyncio.run(engine.grammar_ready(prepared({"regex": "(unclosed"})))
    assert field == "regex" and message


@pytest.mark.parametrize("kwargs,cause", [
    (dict(sampling_params={"temperature": -1}), "temperature"),
    (dict(sampling_params={"top_p": 0}), "top_p"),
    (dict(sampling_params={"max_new_tokens": -2}), "max_new_tokens"),
    (dict(sampling_params={"max_new_tokens": "5"}), "max_new_tokens"),
    (dict(sampling_params={"bogus": 1}), "bogus"),
    (dict(sampling_params={"regex": "a+", "json_schema": "{}"}), "at most one of regex, json_schema"),
    (dict(sampling_params={"custom_params": {"x": 1}}), "not supported yet"),
    (dict(return_logprob=True, logprob_start_len=99), "logprob_start_len"),
    (dict(return_logprob=True, top_logprobs_num=10**6), "top_logprobs_num"),
])
def test_bad_inputs_raise_with_the_cause(engine, kwargs, cause):
    with pytest.raises(ValueError, match=cause):
        engine.generate("Hello", **kwargs)


def test_bad_token_ids_and_lengths(engine):
    with pytest.raises(ValueError, match="vocabulary"):
        engine.generate(input_ids=[1, 2, engine.model_config.vocab_size], sampling_params=GREEDY)
    ctx = engine.capacity().context_length
    with pytest.raises(ValueError, match="context length"):
        engine.generate(input_ids=[1] * ctx, sampling_params=GREEDY)
    with pytest.raises(ValueError, match="exactly one"):
        engine.generate()
    assert engine.generate("still serving", GREEDY)["meta_info"]["completion_tokens"] > 0


def test_start_up_logs_layer_and_memory_plan(tiny_checkpoint, caplog):
    with caplog.at_level(logging.INFO, logger="hybrid_sgl"):
        eng = Engine(model_path=tiny_checkpoint("qwen3_5_moe"), device="cpu", max_total_tokens=2048,
                     max_running_requests=4, log_level="info")
    eng.shutdown()
    text = caplog.text
    assert "layer   0: linear_attention [torch]  ffn moe  [torch]" in text
    assert "layer   3: full_attention" in text
    assert "memory plan:" in text and "x 4 requests" in text and "2048 tokens" in text
    info = eng.server_info()
    assert info["max_total_num_tokens"] == 2048 and info["max_running_requests"] == 4


def test_dummy_load_format_needs_only_config(tmp_path, tiny_checkpoint):
    import shutil

    src = tiny_checkpoint("qwen3_next")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{src}/{name}", tmp_path / name)
    with Engine(model_path=str(tmp_path), load_format="dummy", device="cpu", random_seed=1,
                max_running_requests=2, log_level="warning") as eng:
        out = eng.generate("Hello", {"max_new_tokens": 4, "ignore_eos": True})
    assert len(out["output_ids"]) == 4
    with pytest.raises(FileNotFoundError, match="dummy"):
        Engine(model_path=str(tmp_path), device="cpu", log_level="warning")


def test_shutdown_gives_the_weights_and_pools_back_and_engines_run_in_a_row(tiny_checkpoint):
    """After shutdown nothing the engine keeps holds the model or the pools' memory (a weak reference to
    a weight dies without a collection by the caller), and three engines in a row in one process serve."""
    import weakref

    path = tiny_checkpoint("qwen3_5")
    for _ in range(3):
        engine = Engine(model_path=path, device="cpu", dtype="float32", log_level="warning")
        out = engine.generate(input_ids=[5, 6, 7], sampling_params={"max_new_tokens": 3, "temperature": 0})
        assert len(out["output_ids"]) == 3
        weight = weakref.ref(next(engine.runner.model.parameters()))
        engine.shutdown()
        assert weight() is None and engine.runner.model is None
        assert engine.runner.kv_pool.k.numel() == 0 and engine.runner.state_pool.ssm.numel() == 0


def test_start_up_objects_leave_the_cycle_collector_until_shutdown(tiny_checkpoint):
    """The engine freezes what start-up made (gc.freeze: no full collection walks it while serving) and
    unfreezes at shutdown, so what it leaves is collected again."""
    import gc

    gc.unfreeze()
    engine = Engine(model_path=tiny_checkpoint("qwen3_5"), device="cpu", dtype="float32", log_level="warning")
    try:
        assert gc.get_freeze_count() > 1000
    finally:
        engine.shutdown()
    assert gc.get_freeze_count() == 0
