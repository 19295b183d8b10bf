"""Question: does an Engine give the device back at shutdown, and is the first request of each prompt size
as fast as the next one?

Two engines in a row in one process (a notebook or an offline script uses the Engine this way), on a
`configs/` model with dummy weights and the default settings (CUDA graphs, prefix cache, snapshots):

- device memory: torch.cuda.memory_allocated() and memory_reserved() before the first engine, while it
  serves, and after each `shutdown()` (plus gc.collect() and empty_cache(), as a script would);
- time to first token: two prompts of each size, different tokens (no cache hit), one after the other,
  right after start-up; the first against the second is the warm-up's measure (target <= 1.5x).

    PYTHONPATH=$PWD python bench/engine_cycle.py --config configs/qwen3_5-9b-text --sizes 4096 100 1000 8000
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hybrid_sgl import Engine  # noqa: E402

GIB = 2**30


def memory() -> dict:
    torch.cuda.synchronize()
    return {"allocated_gib": torch.cuda.memory_allocated() / GIB, "reserved_gib": torch.cuda.memory_reserved() / GIB}


def ttft_pairs(engine: Engine, sizes: list[int], vocab: int, rng: random.Random) -> list[dict]:
    """Per size: seconds to the first token of a first and a second prompt of that size."""
    rows = []
    for n in sizes:
        times = []
        for _ in range(2):
            ids = [rng.randrange(1, vocab) for _ in range(n)]
            start = time.perf_counter()
            engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0})
            times.append(time.perf_counter() - start)
        rows.append({"tokens": n, "first_ms": times[0] * 1e3, "second_ms": times[1] * 1e3,
                     "ratio": times[0] / times[1]})
    return rows


def main() -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "qwen3_5-9b-text"))
    ap.add_argument("--sizes", type=int, nargs="+", default=[4096, 100, 1000, 8000], help="prompt sizes, in order")
    ap.add_argument("--engines", type=int, default=2, help="engines started one after another")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    rng = random.Random(0)
    report = {"config": os.path.basename(a.config.rstrip("/")), "before": memory(), "engines": []}
    for i in range(a.engines):
        start = time.perf_counter()
        engine = Engine(model_path=a.config, load_format="dummy", skip_tokenizer_init=True, random_seed=0,
                        log_level="warning")
        row = {"start_s": time.perf_counter() - start, "serving": memory()}
        try:
            vocab = engine.model_config.vocab_size
            row["ttft"] = ttft_pairs(engine, a.sizes if i == 0 else a.sizes[:1], vocab, rng)
        finally:
            engine.shutdown()
        del engine
        gc.collect()
        torch.cuda.empty_cache()
        row["after_shutdown"] = memory()
        report["engines"].append(row)
        print(json.dumps(row), flush=True)
    base = report["before"]["allocated_gib"]
    print("\n| engine | start s | allocated while serving GiB | allocated after shutdown GiB (before: "
          f"{base:.3f}) | reserved after GiB |\n|---|---|---|---|---|")
    for i, r in enumerate(report["engines"]):
        print(f"| {i + 1} | {r['start_s']:.1f} | {r['serving']['allocated_gib']:.2f} "
              f"| {r['after_shutdown']['allocated_gib']:.3f} | {r['after_shutdown']['reserved_gib']:.3f} |")
    print("\n| engine | prompt tokens | first request TTFT ms | second ms | first / second |\n|---|---|---|---|---|")
    for i, r in enumerate(report["engines"]):
        for t in r["ttft"]:
            print(f"| {i + 1} | {t['tokens']} | {t['first_ms']:.1f} | {t['second_ms']:.1f} | {t['ratio']:.2f} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
