"""MoE routing at decode on one GPU: the one-launch `route` kernel under several launch configs, against
routing in separate launches as batches above 16 tokens run it (x widened, cuBLAS's float32 GEMV, the
softmax top-k kernel), at the shapes of Qwen3.5-35B-A3B (E 256, top-8, gated shared expert stacked) and
Qwen3-Next-80B-A3B (E 512, top-10). (The router kernel that `route` replaced took 5.2 us and the top-k
kernel 4.2 us per 35B layer in a batch-1 decode profile, `results/2026-12-01e/call2`.)

    PYTHONPATH=. python bench/route_kernel.py [--tokens 1 8 16]

Each time is the mean of one call among many captured back to back in one CUDA graph, as decode runs
them. The calls cycle through 40 router weights (one per MoE layer, more than L2 holds), so each
reads its weight from memory as a decode step does. "% copy BW" divides the router's float32 bytes
plus x by the time, as a share of the copy bandwidth measured here. Every config is checked against
route_ref (same expert ids) before it is timed.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch
import triton.testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.moe_kernels import copy_bandwidth  # noqa: E402
from triton_kernels.moe_routing import route, route_config, route_ref, router_logits_ref, softmax_topk  # noqa: E402

SHAPES = {"Qwen3.5-35B-A3B": (256, 8, 2048), "Qwen3-Next-80B-A3B": (512, 10, 2048)}  # E, top-k, H
LAYERS = 40
CONFIGS = [dict(BLOCK_R=r, BLOCK_H=h, num_warps=w)
           for r, h, w in itertools.product((1, 2, 4, 8), (512, 2048), (1, 2, 4))]


def in_graph_us(fn) -> float:
    return 1000 * triton.testing.do_bench_cudagraph(fn, rep=50)


def cycling(call, weights: list[torch.Tensor]):
    """fn() calling call(weight) on the next of the layers' weights each time (captured in turn)."""
    layer = itertools.cycle(weights)
    return lambda: call(next(layer))


def case(name: str, e: int, k: int, h: int, t: int, copy_bw: float) -> None:
    """Print the separate launches' row, then the fastest configs of `route` and serving's."""
    g = torch.Generator(device="cuda").manual_seed(t)
    x = torch.randn(t, h, device="cuda", generator=g).bfloat16()
    weights = [torch.randn(e + 1, h, device="cuda", generator=g) / h ** 0.5 for _ in range(LAYERS)]
    kw = dict(top_k=k, renormalize=True, num_experts=e, shared_id=e, shared_gate=True)
    nbytes = (e + 1) * h * 4 + x.numel() * 2

    def row(launches: int, what: str, us: float, base: float) -> None:
        bw = 100 * nbytes / (us * 1e-6) / copy_bw
        print(f"| {name} | {t} | {launches} | {what} | {us:.2f} | {bw:.1f} | {base / us:.2f} |")

    def separate(w: torch.Tensor):
        return softmax_topk(logits=router_logits_ref(x=x, weight=w), **kw)

    base = in_graph_us(cycling(separate, weights))
    row(3, "cast + cuBLAS GEMV + top-k kernel", base, base)
    ref_ids = route_ref(x=x, weight=weights[0], **kw)[1]
    timed = []
    for cfg in CONFIGS:
        try:
            ids = route(x=x, weight=weights[0], config=cfg, **kw)[1]
            assert torch.equal(ids, ref_ids), f"{cfg}: expert ids differ from route_ref"
            timed.append((in_graph_us(cycling(lambda w, c=cfg: route(x=x, weight=w, config=c, **kw), weights)), cfg))
        except Exception as err:  # out of registers or shared memory
            print(f"| {name} | {t} | 1 | {cfg} | failed: {type(err).__name__}: {str(err)[:80]} | | |")
    timed.sort(key=lambda r: r[0])
    serving = route_config(t)
    for us, cfg in timed[:6] + [r for r in timed[6:] if r[1] == serving]:  # the fastest, and serving's
        row(1, f"{cfg}{' (serving)' if cfg == serving else ''}", us, base)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 8, 16])
    a = ap.parse_args()
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s; serving's configs: T 1 {route_config(1)}, "
          f"T 8 {route_config(8)}\n")
    print("| model | T | launches | config | us | % copy BW | vs separate launches |\n|---|---|---|---|---|---|---|")
    for (name, (e, k, h)), t in itertools.product(SHAPES.items(), a.tokens):
        case(name, e, k, h, t, copy_bw)


if __name__ == "__main__":
    main()
