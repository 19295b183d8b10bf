"""Step by step, each step synced and printed: the bf16 fused MoE at the Qwen3.5-35B-A3B expert shape
(T = 1) through each few-token path, eagerly, then timed by do_bench_cudagraph as fastest.py times it,
then the served call. The last line printed names the step a device fault came from.

    PYTHONPATH=. python bench/moe_fault_probe.py [--fp8] [--tokens T]
"""

import argparse
import functools
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.moe_kernels import SHAPES, problem, rel_err  # noqa: E402
from triton_kernels import fused_moe as moe  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--fp8", action="store_true")
    ap.add_argument("--tokens", type=int, default=1)
    args = ap.parse_args()
    e, k, h, i = SHAPES["Qwen3.5-35B-A3B"]
    kw = problem(e, k, h, i, args.tokens, seed=args.tokens, fp8=args.fp8)
    ref = moe.fused_moe_ref(**kw)

    def step(name, fn):
        print(f"{name} ...", flush=True)
        out = fn()
        torch.cuda.synchronize()
        print(f"{name}: ok{'' if out is None else f', {out}'}", flush=True)

    for path in ("dot", "gemv"):
        call = functools.partial(moe._fused_moe_fwd, **kw, activation="silu", path=path)
        step(f"{path} eager", lambda call=call: f"rel err {rel_err(call(), ref):.1e}")
        step(f"{path} do_bench_cudagraph",
             lambda call=call: f"{triton.testing.do_bench_cudagraph(call, rep=20) * 1e3:.1f} us")
        step(f"{path} eager again", lambda call=call: f"rel err {rel_err(call(), ref):.1e}")
    step("served", lambda: f"rel err {rel_err(moe.fused_moe(**kw), ref):.1e}")


if __name__ == "__main__":
    main()
