"""Where the few-token expert GEMVs' time goes (moe_gemv.py, the served few-token MoE), at the Qwen3.5-35B-A3B
expert shape (the shared expert stacked: E 257, k 9), bf16 and FP8 experts: the call's CUDA-graph replay time
(L2 flushed), the up and down kernels' own device times over the same replays (the profiler; L2 flushed
before each), what is left between them, and the floor of two empty kernels replayed from one graph.

    PYTHONPATH=. python bench/moe_gemv_split.py [--tokens 1 8] [--experts bf16 fp8]

Bytes per kernel: the touched experts' w13 (up) and w2 (down) once each.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.gdn_kernels import kernel_times  # noqa: E402
from bench.moe_kernels import SHAPES, bench_ms, copy_bandwidth, graphed, problem  # noqa: E402
from triton_kernels import moe_gemv  # noqa: E402


@triton.jit
def _empty_kernel(x):
    """Does nothing: a launch's floor."""
    pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--experts", nargs="+", choices=["bf16", "fp8"], default=["bf16", "fp8"])
    args = ap.parse_args()
    copy_bw = copy_bandwidth()
    buf = torch.empty(1, device="cuda")
    floor = bench_ms(graphed(lambda: (_empty_kernel[(1,)](buf), _empty_kernel[(1,)](buf))))
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s; two empty kernels from one graph: {floor * 1e3:.1f} us\n")
    print("| experts | T | call us | up us (% copy BW) | down us (% copy BW) | call - up - down us | other kernels |")
    print("|---|---|---|---|---|---|---|")
    e, k, h, i = SHAPES["Qwen3.5-35B-A3B"]
    for fp8 in [experts == "fp8" for experts in args.experts]:
        for tokens in args.tokens:
            kw = problem(e, k, h, i, tokens, seed=tokens, fp8=fp8)
            weights = kw["topk_weights"].float().contiguous()
            replay = graphed(lambda kw=kw, weights=weights: moe_gemv.expert_gemvs(
                kw["x"], kw["w13"], kw["w2"], kw.get("w13_scale"), kw.get("w2_scale"), weights, kw["topk_ids"],
                True, None, None))
            call = bench_ms(replay)
            times = dict(kernel_times(lambda replay=replay: (flush.zero_(), replay()), iters=20))
            up = sum(t for name, t in times.items() if "_up_gemv_kernel" in name)
            down = sum(t for name, t in times.items() if "_down_gemv_kernel" in name)
            others = {name[:40]: round(t * 1e3, 1) for name, t in times.items()
                      if "_gemv_kernel" not in name and "FillFunctor" not in name and t * 1e3 >= 0.5}
            experts = kw["topk_ids"].unique().numel()
            size = kw["w13"].element_size()
            up_bytes, down_bytes = experts * kw["w13"][0].numel() * size, experts * kw["w2"][0].numel() * size
            print(f"| {'fp8' if fp8 else 'bf16'} | {tokens} | {call * 1e3:.1f} | "
                  f"{up * 1e3:.1f} ({100 * up_bytes / (up * 1e-3) / copy_bw:.0f}) | "
                  f"{down * 1e3:.1f} ({100 * down_bytes / (down * 1e-3) / copy_bw:.0f}) | "
                  f"{(call - up - down) * 1e3:.1f} | {others} |", flush=True)


if __name__ == "__main__":
    main()
