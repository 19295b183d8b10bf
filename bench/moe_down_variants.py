"""The few-token fused MoE at the Qwen3.5-35B-A3B expert shape (the shared expert stacked: E 257, k 9),
bf16 and FP8 experts, both ways it can run: the tensor-core kernels ("dot") and the expert GEMVs
(moe_gemv.py) as tuned, then the GEMVs with the first up config and each down config. CUDA-graph
replays, L2 flushed; errors against the float32 reference. (Its first run, in
bench/results/2026-12-02e/call1, also timed the down GEMV of a program per slot that this one replaced.)

    PYTHONPATH=. python bench/moe_down_variants.py [--tokens 1 2 4 8] [--experts bf16 fp8]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.moe_kernels import SHAPES, bench_ms, copy_bandwidth, graphed, problem, rel_err  # noqa: E402
from triton_kernels import fused_moe as moe  # noqa: E402
from triton_kernels import moe_gemv  # noqa: E402


def bytes_moved(kw: dict) -> int:
    """Weights of the experts touched (once each), activations in and out."""
    experts = kw["topk_ids"].unique().numel()
    per_expert = (kw["w13"][0].numel() + kw["w2"][0].numel()) * kw["w13"].element_size()
    return experts * per_expert + 2 * kw["x"].numel() * kw["x"].element_size()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--experts", nargs="+", choices=["bf16", "fp8"], default=["bf16", "fp8"])
    args = ap.parse_args()
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s\n")
    print("| experts | T | path | down config | us | % copy BW | rel err vs ref |")
    print("|---|---|---|---|---|---|---|")
    e, k, h, i = SHAPES["Qwen3.5-35B-A3B"]
    ups, downs = moe_gemv.tuned_configs()
    for fp8 in [experts == "fp8" for experts in args.experts]:
        for tokens in args.tokens:
            kw = problem(e, k, h, i, tokens, seed=tokens, fp8=fp8)
            ref = moe.fused_moe_ref(**{n: v.float() if torch.is_tensor(v) and v.dtype == torch.bfloat16 else v
                                       for n, v in kw.items()})
            moved = bytes_moved(kw)
            weights = kw["topk_weights"].float().contiguous()

            def gemvs(configs=None, kw=kw, weights=weights):
                return lambda: moe_gemv.expert_gemvs(kw["x"], kw["w13"], kw["w2"], kw.get("w13_scale"),
                                                     kw.get("w2_scale"), weights, kw["topk_ids"], True, None, None,
                                                     configs=configs)

            rows = [("dot", "", lambda kw=kw: moe._fused_moe_fwd(**kw, activation="silu", path="dot")),
                    ("gemv", "tuned", gemvs())]
            rows += [("gemv", str(c), gemvs(configs=(ups[0], c))) for c in downs]
            for path, config, call in rows:
                err = rel_err(call(), ref)
                ms = bench_ms(graphed(call))
                print(f"| {'fp8' if fp8 else 'bf16'} | {tokens} | {path} | {config} | {ms * 1e3:.1f} | "
                      f"{100 * moved / (ms * 1e-3) / copy_bw:.1f} | {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
