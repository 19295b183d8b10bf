"""Every launch config of the few-token expert GEMVs (triton_kernels/moe_gemv.py) run on its own at the
Qwen3.5-35B-A3B expert shape (the shared expert stacked: E 257, k 9), each followed by a device sync, then
checked against the float32 reference and timed as CUDA-graph replays (L2 flushed). A config that faults
ends the process: the index of the case running is in --progress, so a driver loop can go on after it.

    PYTHONPATH=. python bench/moe_gemv_check.py [--start N] [--progress FILE]
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.moe_kernels import SHAPES, graphed, problem, rel_err  # noqa: E402
from triton_kernels import fused_moe as moe  # noqa: E402
from triton_kernels.moe_gemv import expert_gemvs, tuned_configs  # noqa: E402


def cases() -> list[tuple]:
    """(label, dtype, fp8, T, configs or a path name)."""
    ups, downs = tuned_configs()
    out = []
    for dtype, fp8, tokens in [(torch.bfloat16, False, 1), (torch.float32, False, 1), (torch.bfloat16, True, 1),
                               (torch.bfloat16, False, 2)]:
        name = f"{'fp8' if fp8 else str(dtype).removeprefix('torch.')} T{tokens}"
        out.append((f"{name} dot", dtype, fp8, tokens, "dot"))
        out += [(f"{name} up {c}", dtype, fp8, tokens, (c, downs[0])) for c in ups]
        out += [(f"{name} down {c}", dtype, fp8, tokens, (ups[0], c)) for c in downs]
        out.append((f"{name} tuned", dtype, fp8, tokens, "gemv"))
    return out


def run_case(dtype: torch.dtype, fp8: bool, tokens: int, how) -> tuple[float, float]:
    e, k, h, i = SHAPES["Qwen3.5-35B-A3B"]
    kw = problem(e, k, h, i, tokens, seed=tokens, fp8=fp8)
    if dtype != torch.bfloat16:
        kw = {n: v.to(dtype) if torch.is_tensor(v) and v.dtype == torch.bfloat16 else v for n, v in kw.items()}
    ref = moe.fused_moe_ref(**{n: v.float() if torch.is_tensor(v) and v.dtype == dtype else v for n, v in kw.items()})
    if isinstance(how, str):
        call = lambda: moe._fused_moe_fwd(**kw, activation="silu", path=how)  # noqa: E731
    else:
        call = lambda: expert_gemvs(kw["x"], kw["w13"], kw["w2"], kw.get("w13_scale"), kw.get("w2_scale"),  # noqa: E731
                                    kw["topk_weights"].float().contiguous(), kw["topk_ids"], True, None, None,
                                    configs=how)
    out = call()
    torch.cuda.synchronize()
    err = rel_err(out, ref)
    return err, triton.testing.do_bench(graphed(call), warmup=10, rep=50, return_mode="median")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--start", type=int, default=0)
    ap.add_argument("--progress", default="/tmp/moe_gemv_check.next")
    args = ap.parse_args()
    all_cases = cases()
    for n, (label, dtype, fp8, tokens, how) in enumerate(all_cases):
        if n < args.start:
            continue
        with open(args.progress, "w") as f:
            f.write(str(n + 1))
        err, ms = run_case(dtype, fp8, tokens, how)
        print(f"{n:3d} {label}: rel err {err:.1e}, {ms * 1e3:.1f} us", flush=True)
    with open(args.progress, "w") as f:
        f.write(str(len(all_cases)))


if __name__ == "__main__":
    main()
