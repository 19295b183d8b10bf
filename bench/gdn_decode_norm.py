"""The GDN decode step with its gated output norm, each way it can run, on one GPU: the delta-rule kernel
then the norm kernel (two launches), the served fused kernel (a whole head per program), the same with 8
warps, and the prepared variant where the head's last program normalizes it (narrow V blocks, the unfused
kernel's tiles). Qwen3.5-9B / 35B-A3B linear attention (16 key heads, 32 value heads, K = V = 128), bf16
projections, float32 state pool; timed as CUDA-graph replays of back-to-back calls (device time per call),
each checked against the served fused output and the float32 reference.

    PYTHONPATH=. python bench/gdn_decode_norm.py [--batch 1 8 32 64 256]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.kernels.test_gdn_recurrent import decode_inputs, norm_inputs, pool, rel_err  # noqa: E402
from triton_kernels import gdn_recurrent as gdn  # noqa: E402
from triton_kernels.norms import gated_rmsnorm  # noqa: E402

HK, HV, K, V = 16, 32, 128, 128


def variants(batch: int) -> dict:
    """name -> a call(kwargs, states, slots, pad) returning the normed output [batch, HV, V]."""
    def split(kw, states, slots, pad):
        base = {n: t for n, t in kw.items() if n not in ("z", "norm_weight", "norm_eps")}
        o = gdn.gdn_decode(**base, ssm_states=states, state_slots=slots, pad_slot=pad)
        return gated_rmsnorm(x=o, z=kw["z"], weight=kw["norm_weight"], eps=kw["norm_eps"])

    def config(bv: int, warps: int):
        return lambda kw, states, slots, pad: gdn._gdn_decode_fwd(**kw, ssm_states=states, state_slots=slots,
                                                                  pad_slot=pad, scale=K ** -0.5, BV=bv,
                                                                  num_warps=warps)

    served_bv, served_warps = gdn._decode_config(batch, HV, K, V, whole_heads=True)
    out = {"two launches (decode, then norm)": split,
           f"fused, whole head, {served_warps} warps (served)": config(served_bv, served_warps),
           "fused, whole head, 8 warps": config(V, 8)}
    for bv, warps in ((16, 1), (32, 1), (32, 2), (64, 4)):
        out[f"fused, last program of the head, BV {bv}, {warps} warp(s)"] = config(bv, warps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 64, 256])
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}; Hk {HK}, Hv {HV}, K {K}, V {V}; bf16 inputs, float32 states\n")
    print("| batch | way | us per call | vs two launches | rel err vs served | rel err vs float32 ref |")
    print("|---|---|---|---|---|---|")
    for batch in args.batch:
        num_slots = batch + 1
        kw = {**decode_inputs(batch, HK, HV, K, V, num_slots=num_slots, dtype=torch.bfloat16, device="cuda"),
              **norm_inputs(batch, HV, V, dtype=torch.bfloat16, device="cuda")}
        states = pool(num_slots, HV, K, V, device="cuda")
        slots = torch.arange(batch, device="cuda", dtype=torch.int32)
        ref = gdn.gdn_decode_ref(**kw, ssm_states=states.clone(), state_slots=slots, pad_slot=batch)
        calls = variants(batch)
        served = None
        times = {}
        for name, call in calls.items():
            out = call(kw, states.clone(), slots, batch)
            served = out if "served" in name else served
            scratch = states.clone()  # timed steps keep updating their own copy of the states
            us = 1000 * triton.testing.do_bench_cudagraph(functools.partial(call, kw, scratch, slots, batch), rep=50)
            times[name] = (us, out)
        base = times["two launches (decode, then norm)"][0]
        for name, (us, out) in times.items():
            print(f"| {batch} | {name} | {us:.2f} | {base / us:.2f}x | {rel_err(out, served):.1e} | "
                  f"{rel_err(out, ref):.1e} |")


if __name__ == "__main__":
    main()
