"""Question: how much engine-thread host time does the prefix cache add when prompts share nothing?

The unrelated-prompts workload of `prefix_cache.py` (N random prompts of L tokens, M generated each, all
sent at once), cache on and off, each in its own process, on a tiny Qwen3.5 with the 9B's vocabulary and
the 9B's memory plan on one H100 (running slots, snapshot slots, KV tokens), so that the scheduler and the
cache make the GPU run's decisions. The model's own time is CPU time here and says nothing of a GPU; what
compares is the time outside it: per step kind, the sum of step wall time less the model forward
(scheduling, cache bookkeeping, batch building, sampling, results; bench/step_timing.py).

    PYTHONPATH=$PWD python bench/prefix_host_cost.py [--prompts 128] [--prompt-tokens 1024] [--output 64]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))


def one(a: argparse.Namespace) -> dict:
    from prefix_replay import replay_engine

    with tempfile.TemporaryDirectory() as folder:
        return measure(a, replay_engine(a, folder, disable_radix_cache=a.variant == "no_cache", log_level="warning"))


def measure(a: argparse.Namespace, engine) -> dict:
    """The workload on `engine` (shut down at the end): wall time, snapshots taken, host time by step kind."""
    from step_timing import StepTimer

    prof = None
    if a.profile:  # a cProfile of the engine thread's steps (Scheduler.step)
        import cProfile

        prof, step = cProfile.Profile(), engine.scheduler.step

        def profiled_step():
            prof.enable()
            try:
                return step()
            finally:
                prof.disable()

        engine.scheduler.step = profiled_step
    rng = random.Random(4)
    prompts = [[rng.randrange(10, a.vocab) for _ in range(a.prompt_tokens)] for _ in range(a.prompts)]
    params = {"max_new_tokens": a.output, "temperature": 0, "ignore_eos": True}
    try:
        with StepTimer(engine) as timer:
            start = time.perf_counter()
            engine.generate(input_ids=prompts, sampling_params=params)
            wall = time.perf_counter() - start
        records = timer.take()
        stats = engine.stats()
    finally:
        engine.shutdown()
    if prof is not None:
        import io
        import pstats

        text = io.StringIO()
        summary = pstats.Stats(prof, stream=text)
        summary.sort_stats("tottime").print_stats(25)
        summary.sort_stats("cumulative").print_stats(r"hybrid_sgl/(memory|scheduler|runner)", 40)
        with open(f"{a.profile}.{a.variant}.txt", "w") as f:
            f.write(text.getvalue())
    by_mode: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for r in records:
        row = by_mode[r.mode]
        row[0] += 1
        row[1] += r.host_s
        row[2] += r.schedule_s
        row[3] += r.forward_s
    return {"variant": a.variant, "wall_s": wall, "snapshots_taken": stats["snapshots_taken"],
            "modes": {m: {"steps": n, "host_s": h, "schedule_s": s, "forward_s": f}
                      for m, (n, h, s, f) in by_mode.items()}}


def main() -> None:
    from prefix_replay import add_plan_args

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=128)
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--output", type=int, default=64)
    add_plan_args(p)
    p.add_argument("--profile", default=None, help="write each variant's engine-thread cProfile to PROFILE.VARIANT.txt")
    p.add_argument("--variant", choices=["cache", "no_cache"], help="run this one here (else both, in children)")
    a = p.parse_args()
    if a.variant:
        print(json.dumps(one(a)))
        return
    results = {}
    for variant in ("cache", "no_cache"):
        out = subprocess.run([sys.executable, __file__, *sys.argv[1:], "--variant", variant], check=True,
                             capture_output=True, text=True).stdout
        results[variant] = json.loads(out.strip().splitlines()[-1])
    print(f"{a.prompts} prompts of {a.prompt_tokens} tokens, {a.output} out; host = step wall - model forward\n")
    print("| step kind | steps (cache / none) | host s, cache on | host s, cache off | on - off "
          "| scheduling s, on / off |")
    print("|---|---|---|---|---|---|")
    modes = sorted(set(results["cache"]["modes"]) | set(results["no_cache"]["modes"]))
    empty = {"steps": 0, "host_s": 0.0, "schedule_s": 0.0}
    for m in modes:
        c, n = results["cache"]["modes"].get(m, empty), results["no_cache"]["modes"].get(m, empty)
        print(f"| {m} | {c['steps']} / {n['steps']} | {c['host_s']:.3f} | {n['host_s']:.3f} "
              f"| {c['host_s'] - n['host_s']:+.3f} | {c['schedule_s']:.3f} / {n['schedule_s']:.3f} |")
    print(f"\nwall: cache on {results['cache']['wall_s']:.2f} s, off {results['no_cache']['wall_s']:.2f} s; "
          f"snapshots taken {results['cache']['snapshots_taken']}")


if __name__ == "__main__":
    main()
