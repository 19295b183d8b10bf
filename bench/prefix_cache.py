"""Question: what does the prefix cache save (hit TTFT, prompt tokens computed, throughput) and cost
(unrelated prompts), against the same engine without it?

Prefix cache on a real model shape with random weights: the cache on and off in the same run.

    PYTHONPATH=$PWD python bench/prefix_cache.py offline --config configs/qwen3_5-9b-text --out pc.json
    PYTHONPATH=$PWD python bench/prefix_cache.py multiturn --config configs/qwen3_5-9b-text --out mt.json

offline (in-process Engine, one engine with the cache and one without):
- hit TTFT: a 4096-token prefix + 64 new tokens, after one request with the same prefix and
  another suffix; against the cold TTFT of the same shape (median of --reps prefixes);
- n = 8 on a 2048-token prompt: prompt tokens the engine computed (its counter), and wall time;
- shared prefix + long suffix: --shared-requests requests over 32 system prompts of 1-6k tokens,
  each plus a random 300-1500-token suffix, all submitted at once, 16 tokens out: hit rate =
  cached tokens / system-prompt tokens, and throughput;
- nothing shared: 256 random 1k-token prompts, 256 tokens out, all at once: output tok/s and mean
  TTFT (first streamed token).
multiturn (over HTTP, a launched server each with and without --disable-radix-cache): --users
simulated users x --turns turns; each turn sends the whole conversation so far plus ~200 new
tokens and generates 128: total throughput, mean and p90 TTFT, and each turn's (min, mean, max) TTFT.
TTFT is wall time from submission to the first token seen by the caller.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("part", choices=["offline", "multiturn", "offline-one"])
    p.add_argument("--variant", default="cache", choices=["cache", "no_cache"], help="offline-one: which engine")
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "qwen3_5-9b-text"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--shared-requests", type=int, default=500)
    p.add_argument("--users", type=int, default=64)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--cases", default="ttft,n8,shared,random")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every prompt length (small models on CPU)")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--server-args", default="",
                   help="multiturn: more launch_server flags, e.g. '--max-running-requests 64' (CPU runs cap it at 32)")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


SCALE = 1.0


def _tokens(rng: random.Random, vocab: int, n: int) -> list[int]:
    return [rng.randrange(10, vocab) for _ in range(max(1, int(n * SCALE)))]


# ---- offline ---------------------------------------------------------------------------------------
def _engine(args, disable: bool):
    from hybrid_sgl import Engine

    extra = {k: json.loads(v) if v[:1] in "0123456789-[{tf" else v
             for k, v in (a.split("=", 1) for a in args.engine_arg)}
    return Engine(model_path=args.config, load_format="dummy", skip_tokenizer_init=True,
                  context_length=int(8192 * SCALE),
                  random_seed=0, disable_radix_cache=disable, **extra)


def _stats(engine) -> dict:
    return engine.run_on_engine(lambda s: s.cache_stats())


def _timed(engine, ids, max_new=1, **extra) -> tuple[float, dict]:
    start = time.perf_counter()
    out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": max_new, "temperature": 0,
                                                          "ignore_eos": True, **extra})
    return time.perf_counter() - start, out


def case_ttft(engine, vocab: int, reps: int) -> dict:
    rng = random.Random(1)
    cold, second, hit, cached = [], [], [], []
    _timed(engine, _tokens(rng, vocab, 512))  # warm-up
    for _ in range(reps):
        prefix = _tokens(rng, vocab, 4096)
        t, _ = _timed(engine, prefix + _tokens(rng, vocab, 64))
        cold.append(t)
        t, out = _timed(engine, prefix + _tokens(rng, vocab, 64))
        second.append(t)
        t, out = _timed(engine, prefix + _tokens(rng, vocab, 64))
        hit.append(t)
        cached.append(out["meta_info"]["cached_tokens"])
    profile = _profile(engine, prefix + _tokens(rng, vocab, 64))
    return {"profile_of_a_hit": profile, "cold_ttft_ms": 1e3 * statistics.median(cold),
            "second_ttft_ms": 1e3 * statistics.median(second),
            "hit_ttft_ms": 1e3 * statistics.median(hit), "hit_cached_tokens": cached,
            "hit_over_cold": statistics.median(hit) / statistics.median(cold)}


def _profile(engine, ids: list[int]) -> str:
    """Device kernels of one more hit, by total device time, and its wall time."""
    import torch
    from step_timing import StepTimer

    with StepTimer(engine) as timer:
        t0, _ = _timed(engine, ids[:-1] + [ids[-1] ^ 1])  # another hit, its steps timed
    steps = "\n".join(f"step {r.mode} new={r.new_tokens} wall={1e3 * r.wall_s:.2f} schedule={1e3 * r.schedule_s:.2f} "
                      f"build={1e3 * r.build_s:.2f} run={1e3 * r.run_s:.2f} forward={1e3 * r.forward_s:.2f} ms"
                      for r in timer.take())
    if not torch.cuda.is_available():
        return f"timed hit: wall {1e3 * t0:.1f} ms\n{steps}"
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        t, out = _timed(engine, ids)
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60)
    return (f"timed hit: wall {1e3 * t0:.1f} ms\n{steps}\nprofiled hit: wall {1e3 * t:.1f} ms, cached "
            f"{out['meta_info']['cached_tokens']}\n{table}")


def case_n8(engine, vocab: int) -> dict:
    rng = random.Random(2)
    _timed(engine, _tokens(rng, vocab, 2048), max_new=128, n=8, temperature=0.7, sampling_seed=4)  # warm-up
    prompt = _tokens(rng, vocab, 2048)
    before = _stats(engine)["computed_prompt_tokens"]
    t, outs = _timed(engine, prompt, max_new=128, n=8, temperature=0.7, sampling_seed=5)
    computed = _stats(engine)["computed_prompt_tokens"] - before
    return {"seconds": t, "computed_prompt_tokens": computed, "prompt_tokens": 8 * len(prompt),
            "cached_tokens": [o["meta_info"]["cached_tokens"] for o in outs]}


def _stream_batch(engine, prompts: list[list[int]], max_new: int) -> dict:
    start = time.perf_counter()
    first: dict[int, float] = {}
    outs: dict[int, dict] = {}
    for chunk in engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": max_new, "temperature": 0,
                                                                     "ignore_eos": True}, stream=True):
        i = chunk["index"]
        if i not in first and chunk["meta_info"]["completion_tokens"] > 0:
            first[i] = time.perf_counter() - start
        outs[i] = chunk
    wall = time.perf_counter() - start
    generated = sum(o["meta_info"]["completion_tokens"] for o in outs.values())
    return {"seconds": wall, "output_tok_s": generated / wall, "mean_ttft_ms": 1e3 * statistics.mean(first.values()),
            "cached_tokens": sum(o["meta_info"]["cached_tokens"] for o in outs.values()), "outs": outs}


def shared_prompts(vocab: int, n: int) -> tuple[list[list[int]], list[int], list[int]]:
    """The shared-prefix workload: n prompts, each one of 32 system prompts of 1-6k tokens + 300-1,500
    tokens of its own. Returns the prompts, each one's system prompt (0-31) and the system prompts' lengths."""
    rng = random.Random(3)
    systems = [_tokens(rng, vocab, rng.randrange(1000, 6001)) for _ in range(32)]
    prompts, which = [], []
    for _ in range(n):
        k = rng.randrange(len(systems))  # what rng.choice(systems) draws
        prompts.append(systems[k] + _tokens(rng, vocab, rng.randrange(300, 1501)))
        which.append(k)
    return prompts, which, [len(x) for x in systems]


def case_shared(engine, vocab: int, n: int) -> dict:
    prompts, which, lens = shared_prompts(vocab, n)
    shared = sum(lens[k] for k in which)
    r = _stream_batch(engine, prompts, 16)
    r.pop("outs")
    return {**r, "requests": n, "shared_prefix_tokens": shared, "hit_rate": r["cached_tokens"] / shared,
            "prompt_tokens": sum(map(len, prompts))}


def case_random(engine, vocab: int) -> dict:
    rng = random.Random(4)
    r = _stream_batch(engine, [_tokens(rng, vocab, 1024) for _ in range(256)], 256)
    r.pop("outs")
    return r


def offline(args, argv: list[str]) -> dict:
    """Each engine in its own process, as a server would run (one process, one engine)."""
    import subprocess
    import tempfile

    report = {"config": os.path.basename(args.config)}
    for label in ("cache", "no_cache"):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            rest = [a for a in argv if a not in ("offline",)]
            rest = [a for i, a in enumerate(rest) if a != "--out" and (i == 0 or rest[i - 1] != "--out")]
            subprocess.run([sys.executable, __file__, "offline-one", "--variant", label, *rest, "--out", out.name],
                           check=True)
            with open(out.name) as f:
                report[label] = json.load(f)[label]
    return report


def offline_one(args) -> dict:
    from hybrid_sgl.config import ModelConfig

    vocab = ModelConfig.from_hf(args.config).vocab_size
    cases = args.cases.split(",")
    report = {"config": os.path.basename(args.config)}
    for label, disable in ((args.variant, args.variant == "no_cache"),):
        engine = _engine(args, disable)
        try:
            info = engine.server_info()
            r = {"max_snapshots": info["max_snapshots"], "snapshot_gib": info["snapshot_bytes"] / 2**30}
            if "ttft" in cases:
                r["ttft"] = case_ttft(engine, vocab, args.reps)
            if "n8" in cases:
                r["n8"] = case_n8(engine, vocab)
            if "shared" in cases:
                r["shared"] = case_shared(engine, vocab, args.shared_requests)
            if "random" in cases:
                r["random"] = case_random(engine, vocab)
            r["cache_stats"] = _stats(engine)
        finally:
            engine.shutdown()
        report[label] = r
        print(json.dumps({label: r}, indent=1), flush=True)
    return report


# ---- multi-turn over HTTP --------------------------------------------------------------------------
async def _turn(url: str, ids: list[int], max_new: int) -> tuple[float, list[int], int, float, float]:
    """(TTFT s, output ids, cached tokens, wall-clock time sent, wall-clock time of the last event): the
    wall-clock times line up with the server log's timestamps."""
    from http_client import open_request

    payload = {"input_ids": ids, "stream": True, "sampling_params": {"max_new_tokens": max_new, "temperature": 0,
                                                                      "ignore_eos": True}}
    sent = time.time()
    start, ttft, out, cached = time.perf_counter(), None, [], 0
    response = await open_request(url + "/generate", "POST", payload, None, 3600)
    try:
        assert response.status == 200, response.status
        async for arrived, data in response.events():
            if data == "[DONE]":
                break
            event = json.loads(data)
            if ttft is None and event["meta_info"]["completion_tokens"] > 0:
                ttft = arrived - start
            out = event["output_ids"]
            cached = event["meta_info"]["cached_tokens"]
    finally:
        response.close()
    return ttft, out, cached, sent, time.time()


async def _users(url: str, vocab: int, users: int, turns: int) -> dict:
    rng = random.Random(7)

    async def user(u: int) -> list[tuple[float, int, int, float, float]]:
        history, rows = [], []
        for _ in range(turns):
            history = history + _tokens(rng, vocab, rng.randrange(150, 251))
            ttft, out, cached, sent, done = await _turn(url, history, 128)
            history = history + out
            rows.append((ttft, len(out), cached, sent, done))
        return rows

    start = time.perf_counter()
    results = await asyncio.gather(*(user(u) for u in range(users)))
    wall = time.perf_counter() - start
    rows = [r for rs in results for r in rs]
    by_turn = [[rs[k][0] for rs in results] for k in range(turns)]
    # the client's own share of the time between turns: a user's next request sent after its last answer ended
    client_gaps = [rs[k][3] - rs[k - 1][4] for rs in results for k in range(1, turns)]
    return {"seconds": wall, "output_tok_s": sum(r[1] for r in rows) / wall,
            "mean_ttft_ms": 1e3 * statistics.mean(r[0] for r in rows),
            "p90_ttft_ms": 1e3 * statistics.quantiles([r[0] for r in rows], n=10)[-1],
            "ttft_ms_by_turn": [[round(1e3 * f(ts), 1) for f in (min, statistics.mean, max)] for ts in by_turn],
            "client_gap_ms": [round(1e3 * f(client_gaps), 2) for f in (statistics.mean, max)] if client_gaps else None,
            # per user and turn: wall-clock sent / last event, against the server log's step lines
            "times": [[[round(r[3], 3), round(r[4], 3)] for r in rs] for rs in results],
            "cached_tokens": sum(r[2] for r in rows), "turns": len(rows)}


def multiturn(args) -> dict:
    from http_client import launched_server

    from hybrid_sgl.config import ModelConfig

    vocab = ModelConfig.from_hf(args.config).vocab_size
    report = {"config": os.path.basename(args.config)}
    for label, flag in (("cache", ""), ("no_cache", " --disable-radix-cache")):
        server = (f"--model-path {args.config} --load-format dummy --skip-tokenizer-init "
                  f"--context-length {int(8192 * SCALE)} "
                  f"--random-seed 0 --decode-log-interval 8{flag} {args.server_args}")
        log = os.path.join(os.environ.get("OUT", "."), f"multiturn_{label}.log")
        with launched_server(server, log, 1200) as url:
            report[label] = asyncio.run(_users(url, vocab, args.users, args.turns))
        print(json.dumps({label: {k: v for k, v in report[label].items() if k != "times"}}), flush=True)
    c, n = report["cache"], report["no_cache"]
    report["throughput_ratio"] = c["output_tok_s"] / n["output_tok_s"]
    report["ttft_ratio"] = n["mean_ttft_ms"] / c["mean_ttft_ms"]
    return report


def main(argv=None) -> dict:
    global SCALE
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    SCALE = args.scale
    parts = {"offline": lambda: offline(args, argv), "offline-one": lambda: offline_one(args),
             "multiturn": lambda: multiturn(args)}
    report = parts[args.part]()
    print(json.dumps({k: v for k, v in report.items() if k in ("throughput_ratio", "ttft_ratio")}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
