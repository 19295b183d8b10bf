"""Host microseconds a kernel launch costs: Triton's own launch path against the cached launch
(triton_kernels/cached_launch.py), with a torch op and a cuBLAS matmul for scale.

    PYTHONPATH=$PWD python bench/launch_overhead.py

Each case issues `--launches` launches of a small kernel back to back without a sync (the device runs
each in a few microseconds, so the host is the bound) and reports the host time per launch, the best of
`--repeats` runs. CUDA only.
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
    others = {"torch.add": lambda: torch.add(x, r), "F.linear (cuBLAS)": lambda: torch.nn.functional.linear(x, weight),
              "torch.empty_like (no kernel)": lambda: torch.empty_like(x)}
    for name, fn in others.items():
        print(f"| {name} | {host_us(fn, a.launches, a.repeats):.1f} | | |")


if __name__ == "__main__":
    main()
