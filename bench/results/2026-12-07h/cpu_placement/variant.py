"""bench/prefix_replay.py with a snapshot placement variant: VARIANT=base (the default cuts) | three (from 256,
three cuts a doubling on 64-token multiples instead of four). Run from the repository root:

    OMP_NUM_THREADS=1 VARIANT=three PYTHONPATH=$PWD python bench/results/2026-12-07h/cpu_placement/variant.py \\
        --requests 1000 --max-running 256 --snapshots 355 --kv-tokens 620560 --out three.json
"""
import os
import runpy
import sys

sys.path.insert(0, os.getcwd())
import hybrid_sgl.scheduler.prefix_sharing as ps  # noqa: E402

v = os.environ.get("VARIANT", "base")
base_cut_points = ps.cut_points


def three(start, end, interval):
    if interval:
        return base_cut_points(start, end, interval)
    out, base = [], 64
    while base < end:
        if base < 256:
            pts = [base, base * 3 // 2]
        else:
            pts = [base, round(base * 2 ** (1 / 3) / 64) * 64, round(base * 2 ** (2 / 3) / 64) * 64]
        out.extend(p for p in pts if start < p < end)
        base *= 2
    return sorted(set(out))


if v != "base":
    ps.cut_points = three
print(ps.cut_points(0, 5000, None), file=sys.stderr)
sys.argv = ["bench/prefix_replay.py", *sys.argv[1:]]
runpy.run_path("bench/prefix_replay.py", run_name="__main__")
