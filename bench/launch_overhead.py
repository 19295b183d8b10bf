"""Host microseconds a kernel launch costs: Triton's own launch path against the cached launch
(triton_kernels/cached_launch.py), with a torch op and a cuBLAS matmul for scale.

    PYTHONPATH=$PWD python bench/launch_overhead.py

Each case issues `--launches` launches of a small kernel back to back without a sync (the device runs
each in a few microseconds, so the host is the bound) and reports the host time per launch, the best of
`--repeats` runs. A second table splits one cached launch into its parts, each timed alone on the case's
own arguments: the wrapper's Python and tensors with the launch itself skipped, the cache key, the device
and stream queries, the driver launcher's Python call, and the compiled C launch it wraps. CUDA only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from triton_kernels import cached_launch  # noqa: E402
from triton_kernels.fp8_weight_only import dense_few_rows_gemm  # noqa: E402
from triton_kernels.norms import add_rmsnorm, rmsnorm  # noqa: E402


def host_us(fn, launches: int, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(launches):
            fn()
        best = min(best, time.perf_counter() - start)
        torch.cuda.synchronize()
    return best / launches * 1e6


def parts_us(fn, a) -> list:
    """Host us of one cached launch and of its parts (see the module docstring); None where a part does
    not apply (the C launch's arguments are Triton 3.6's: other versions skip it)."""
    launch = cached_launch.CachedLaunch.launch
    seen = []

    def record(self, grid, args, kwargs):
        seen.append((self, grid, args, kwargs))
        launch(self, grid, args, kwargs)

    cached_launch.CachedLaunch.launch = record
    try:
        fn()
    finally:
        cached_launch.CachedLaunch.launch = launch
    whole = host_us(fn, a.launches, a.repeats)
    cached_launch.CachedLaunch.launch = lambda self, grid, args, kwargs: None
    try:
        wrapper = host_us(fn, a.launches, a.repeats)
    finally:
        cached_launch.CachedLaunch.launch = launch
    inst, grid, args, kwargs = seen[-1]
    device = inst._device()
    entry = inst.compiled[inst.key(device, args, kwargs)]
    grid = grid(entry.meta) if callable(grid) else grid
    grid = tuple(grid) + (1,) * (3 - len(grid))
    tail = entry.tail if entry.tail is not None else tuple(
        kwargs[k] if k in kwargs else entry.meta[k] for k in entry.tail_names)
    stream = inst._stream(device)
    run = entry.launcher
    key = host_us(lambda: inst.key(device, args, kwargs), a.launches, a.repeats)
    queries = host_us(lambda: inst._stream(inst._device()), a.launches, a.repeats)
    call = host_us(lambda: run(*grid, stream, entry.function, entry.packed_metadata, None, None, None, *args, *tail),
                   a.launches, a.repeats)
    c_launch = None
    if triton.__version__.startswith("3.6") and not (run.global_scratch_size or run.profile_scratch_size):
        c_launch = host_us(lambda: run.launch(*grid, stream, entry.function, run.launch_cooperative_grid,
                                              run.launch_pdl, None, None, entry.packed_metadata, None, None, None,
                                              *args, *tail), a.launches, a.repeats)
    return [whole, wrapper, key, queries, call, c_launch]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launches", type=int, default=200)
    p.add_argument("--repeats", type=int, default=20)
    a = p.parse_args()
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    r, w = torch.randn_like(x), torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    cases = {
        "rmsnorm (13 arguments)": lambda: rmsnorm(x=x, weight=w, eps=1e-6),
        "add_rmsnorm (two outputs)": lambda: add_rmsnorm(x=x, residual=r, weight=w, eps=1e-6),
        "few-rows GEMM (autotuned, 14 arguments)": lambda: dense_few_rows_gemm(x=x, weight=weight),
    }
    print(f"# Host microseconds a launch, {torch.cuda.get_device_name()}, triton {triton.__version__}\n")
    print("| launch | Triton's path | cached | saved |\n|---|---|---|---|")
    for name, fn in cases.items():
        cached_launch.ENABLED = False
        slow = host_us(fn, a.launches, a.repeats)
        cached_launch.ENABLED = True
        fast = host_us(fn, a.launches, a.repeats)
        print(f"| {name} | {slow:.1f} | {fast:.1f} | {slow - fast:.1f} |")
    print("\n| cached launch, its parts (us) | whole call | wrapper, launch skipped | key | device + stream |"
          " launcher | C launch |\n|---|---|---|---|---|---|---|")
    for name, fn in cases.items():
        print(f"| {name} | " + " | ".join(f"{v:.1f}" if v is not None else "-" for v in parts_us(fn, a)) + " |")
    others = {"torch.add": lambda: torch.add(x, r), "F.linear (cuBLAS)": lambda: torch.nn.functional.linear(x, weight),
              "torch.empty_like (no kernel)": lambda: torch.empty_like(x)}
    for name, fn in others.items():
        print(f"| {name} | {host_us(fn, a.launches, a.repeats):.1f} | | |")


if __name__ == "__main__":
    main()
