"""Question: which requests of the shared-prefix workload miss the prefix cache, and why, without a GPU?

    PYTHONPATH=$PWD python bench/prefix_replay.py [--requests 1000] [--vocab 248320] \
        [--max-running 256] [--snapshots 220] [--kv-tokens 832656] [--out replay.json]

The scheduler and the prefix cache decide from token counts alone, so the GPU run's schedule (and its
hit rate) replays exactly on CPU with a tiny Qwen3.5 of the same vocabulary (the workload's tokens are
drawn from it) and the GPU run's memory plan: running slots, snapshot slots, KV tokens (the defaults are
the 9B's plan on one H100, `results/2026-12-06/call2/prefix_9b.log`; since 6c3a263 that budget plans 238 running
slots, 238 snapshots and 832,784 KV tokens). About 10 minutes on two cores (1,000 requests).

Reported: the hit rate (cached / shared-prefix tokens), and the shared tokens lost by the first request
of each system prompt (nothing to hit), by later requests that hit nothing, and by partial hits.
"""

import argparse
import collections
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))


def tiny_config(vocab: int, folder: str) -> str:
    """The bundled tiny Qwen3.5's config with `vocab` tokens and room for 16k positions."""
    with open(os.path.join(ROOT, "configs", "default-tiny-qwen3_5", "config.json")) as f:
        config = json.load(f)
    config.update(vocab_size=vocab, max_position_embeddings=16384)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    return folder


def add_plan_args(p: argparse.ArgumentParser) -> None:
    """The replayed memory plan: the vocabulary and the running slots, snapshot slots and KV tokens of the GPU
    run (defaults: the 9B's plan on one H100 before 6c3a263, which the recorded GPU runs had)."""
    p.add_argument("--vocab", type=int, default=248320)
    p.add_argument("--max-running", type=int, default=256)
    p.add_argument("--snapshots", type=int, default=220)
    p.add_argument("--kv-tokens", type=int, default=832656)


def replay_engine(a: argparse.Namespace, folder: str, **engine_args):
    """An Engine on CPU over tiny_config(a.vocab) in `folder` with the plan of add_plan_args."""
    from hybrid_sgl import Engine

    return Engine(model_path=tiny_config(a.vocab, folder), load_format="dummy", skip_tokenizer_init=True,
                  device="cpu", context_length=8192, random_seed=0, max_running_requests=a.max_running,
                  max_mamba_cache_size=a.max_running + a.snapshots, max_total_tokens=a.kv_tokens, **engine_args)


def losses(which: list[int], lens: list[int], cached: list[int]) -> dict:
    """Shared tokens lost, by kind of request: first of its system prompt, later with no hit, partial hit."""
    seen, out = set(), collections.Counter()
    for k, c in zip(which, cached):
        gap = lens[k] - min(c, lens[k])
        kind = "first" if k not in seen else "no_hit" if c == 0 else "partial" if gap else "full"
        seen.add(k)
        out[kind + "_requests"] += 1
        out[kind + "_tokens_lost"] += gap
    return dict(sorted(out.items()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=1000)
    add_plan_args(p)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    from prefix_cache import shared_prompts

    prompts, which, lens = shared_prompts(a.vocab, a.requests)
    with tempfile.TemporaryDirectory() as folder:
        engine = replay_engine(a, folder)
        try:
            outs = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 16, "temperature": 0,
                                                                        "ignore_eos": True})
            stats = engine.run_on_engine(lambda s: s.cache_stats())
        finally:
            engine.shutdown()
    cached = [o["meta_info"]["cached_tokens"] for o in outs]
    shared = sum(lens[k] for k in which)
    report = {"requests": a.requests, "hit_rate": sum(cached) / shared, **losses(which, lens, cached),
              "cache_stats": stats}
    print(json.dumps(report, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
