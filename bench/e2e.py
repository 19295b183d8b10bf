"""End-to-end offline throughput on the GPU: hybrid_sgl Engine vs HF transformers `generate`,
same model shape (configs/qwen3_5-9b-text, random bf16 weights), same run.

    PYTHONPATH=. python bench/e2e.py [--skip-hf] [--decode-tokens 64]

Cases (ANCHORS.md): decode at batch 1 and 32 after a 512-token prompt; prefill of 8192 tokens.
Decode rate = (N - 1) / (t(N tokens) - t(1 token)), so prefill time cancels out.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "qwen3_5-9b-text")
WEIGHT_BYTES = 8.95e9 * 2


def _prompts(batch: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g).tolist()


def _timed(fn, *args) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn(*args)
    torch.cuda.synchronize()
    return time.perf_counter() - t


def bench_ours(decode_tokens: int) -> dict:
    sys.path.insert(0, ROOT)
    from hybrid_sgl import Engine

    eng = Engine(model_path=CONFIG, load_format="dummy", skip_tokenizer_init=True, dtype="bfloat16",
                 device="cuda", context_length=16384, max_running_requests=64, mem_fraction_static=0.45,
                 chunked_prefill_size=8192, random_seed=0, log_level="warning")
    vocab = eng.model_config.vocab_size

    def run(ids, n):
        eng.generate(input_ids=ids, sampling_params={"max_new_tokens": n, "ignore_eos": True, "temperature": 0})

    run(_prompts(2, 64, vocab), 4)  # warm-up: compile kernels
    graphs = eng.runner.graphs
    sizes = graphs.sizes if graphs else "off"
    out = {"backends": f"{eng.runner.model.dispatch_plan()[0]}; decode CUDA graphs: {sizes}"}
    for batch in (1, 32):
        ids = _prompts(batch, 512, vocab, seed=batch)
        run(ids, 2)
        t1 = _timed(run, ids, 1)
        tn = _timed(run, ids, decode_tokens)
        out[f"decode_b{batch}_tok_s"] = batch * (decode_tokens - 1) / (tn - t1)
    ids = _prompts(1, 8192, vocab, seed=9)
    run(ids, 1)
    out["prefill_8192_s"] = min(_timed(run, ids, 1) for _ in range(3))
    eng.shutdown()
    return out


def bench_hf(decode_tokens: int) -> dict:
    import transformers as tf

    cfg = tf.AutoConfig.from_pretrained(CONFIG)
    with torch.device("cuda"):
        model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    vocab = cfg.vocab_size

    def gen(ids, n):
        with torch.no_grad():
            model.generate(torch.tensor(ids, device="cuda"), max_new_tokens=n, min_new_tokens=n, do_sample=False)

    gen(_prompts(1, 64, vocab), 4)
    out = {}
    for batch in (1, 32):
        ids = _prompts(batch, 512, vocab, seed=batch)
        gen(ids, 2)  # warm-up at this batch size
        t1 = _timed(gen, ids, 1)
        tn = _timed(gen, ids, decode_tokens)
        out[f"decode_b{batch}_tok_s"] = batch * (decode_tokens - 1) / (tn - t1)
    ids = _prompts(1, 8192, vocab, seed=9)
    out["prefill_8192_s"] = min(_timed(gen, ids, 1) for _ in range(2))
    return out


def copy_bandwidth() -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    import triton.testing

    ms = triton.testing.do_bench(lambda: y.copy_(x), return_mode="median")
    return 2 * x.numel() / (ms * 1e-3)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--decode-tokens", type=int, default=64)
    a = p.parse_args()
    bw = copy_bandwidth()
    ours = bench_ours(a.decode_tokens)
    import gc

    gc.collect()
    torch.cuda.empty_cache()
    hf = {} if a.skip_hf else bench_hf(max(8, a.decode_tokens // 4))
    roof_b1 = bw / WEIGHT_BYTES
    print(f"\ncopy bandwidth {bw / 1e12:.2f} TB/s; batch-1 decode roofline {roof_b1:.0f} tok/s (weights only)")
    print(f"ours: {ours.pop('backends')}")
    print("| case | hybrid_sgl | HF generate | ratio | note |\n|---|---|---|---|---|")
    for key, unit in (("decode_b1_tok_s", "tok/s"), ("decode_b32_tok_s", "tok/s"), ("prefill_8192_s", "s")):
        o, h = ours[key], hf.get(key)
        ratio = "" if h is None else (f"{o / h:.1f}x" if unit == "tok/s" else f"{h / o:.1f}x")
        note = f"{100 * o / roof_b1:.0f}% of roofline" if key == "decode_b1_tok_s" else ""
        print(f"| {key} | {o:.3g} {unit} | {'' if h is None else f'{h:.3g} {unit}'} | {ratio} | {note} |")


if __name__ == "__main__":
    main()
