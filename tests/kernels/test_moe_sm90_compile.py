"""The MoE decode kernels compile for Hopper (sm_90a) at the Qwen3.5-35B-A3B shape with the launch
configs serving picks at T = 1, and ptxas reports no register spills: the one-launch router (with the
pre-norm too, up to its largest hidden size), the fused MoE's up and down GEMMs (bf16 and FP8 experts),
and every tuned config of the few-token expert GEMVs.

The GEMMs and GEMVs are built as launched at that shape: H and I multiples of 16, which lets Triton pipeline
their masked loads (cp.async); built without it they load synchronously and use other registers.

Needs no GPU (tests/kernels/sm90.py)."""

import pytest
import torch

from tests.kernels.sm90 import compile_sm90_in_subprocess

SCRIPT = r'''
from triton_kernels import fused_moe as moe, moe_routing as routing

E, K, H, I = 257, 9, 2048, 512  # 256 experts + the stacked shared one, top-8 + its slot
up_cfg, down_cfg = moe._gemm_configs(K, E, torch.bfloat16, torch.device("cuda"))
types = dict(x="*bf16", w="*fp32", logits="*fp32", weights="*fp32", ids="*i64", arrivals="*i32", res="*bf16",
             nw="*bf16", h_out="*bf16", r_out="*bf16", eps="fp32", offset="fp32")
for t in (1, 16):
    for norm_h in (None, H, routing.NORM_ROUTE_MAX_HIDDEN):  # the pre-norm in the router: whole rows of H
        c = routing.route_config(t, norm_h)
        out[f"route T{t}" + (f" norm H{norm_h}" if norm_h else "")] = compile_sm90(routing._route_kernel, types, dict(
            TOP_K=8, RENORM=True, SLOTS=9, SHARED_GATE=True, NORM=bool(norm_h), BLOCK_R=c["BLOCK_R"],
            BLOCK_H=c["BLOCK_H"], BLOCK_T=t, BLOCK_E=256, BLOCK_K=16), c["num_warps"], 1)
for fp8 in (False, True):
    w = "*fp8e4nv" if fp8 else "*bf16"
    scale = "*fp32" if fp8 else w
    up_types = dict(x="*bf16", w13=w, s13=scale, inter="*bf16", sorted_assign="*i64", expert_offsets="*i64")
    out[f"up {'fp8' if fp8 else 'bf16'}"] = compile_sm90(moe._moe_up_kernel, up_types, dict(
        TOPK=K, GATED=True, PREC="tf32", NUM_BINS=moe.bins_for(E), BLOCK_M=up_cfg["BLOCK_M"],
        BLOCK_N=up_cfg["BLOCK_N"], BLOCK_K=up_cfg["BLOCK_K"], EVEN_K=True, UNSORTED=True, FP8_W=fp8),
        up_cfg["num_warps"], up_cfg["num_stages"], divisible=("H", "I"))
    down_types = dict(inter="*bf16", w2=w, s2=scale, rows="*fp32", sorted_assign="*i64", expert_offsets="*i64",
                      topk_weights="*fp32", out="*bf16", shared="*bf16", shared_gate="*bf16", arrivals="*i32")
    out[f"down {'fp8' if fp8 else 'bf16'}"] = compile_sm90(moe._moe_down_kernel, down_types, dict(
        TOPK=K, PREC="tf32", NUM_BINS=moe.bins_for(E), BLOCK_M=down_cfg["BLOCK_M"], BLOCK_N=down_cfg["BLOCK_N"],
        BLOCK_K=down_cfg["BLOCK_K"], EVEN_K=True, UNSORTED=True, FP8_W=fp8, SUM_SLOTS=True, HAS_SHARED=False,
        HAS_GATE=False), down_cfg["num_warps"], down_cfg["num_stages"], divisible=("H", "I"))
from triton_kernels import moe_gemv
for fp8 in (False, True):
    w, name = ("*fp8e4nv", "fp8") if fp8 else ("*bf16", "bf16")
    scale = "*fp32" if fp8 else w
    for c in moe_gemv._up_tuned.configs:
        types = dict(x="*bf16", w13=w, s13=scale, inter="*bf16", ids="*i64")
        out[f"gemv up {name} {c.kwargs}"] = compile_sm90(moe_gemv._up_gemv_kernel, types, dict(
            TOPK=K, GATED=True, FP8_W=fp8, ROW_SCALES=False, **c.kwargs), c.num_warps, 1, divisible=("H", "I"))
    for c in moe_gemv._down_tuned.configs:
        types = dict(inter="*bf16", w2=w, s2=scale, ids="*i64", topk_weights="*fp32", out="*bf16",
                     shared="*bf16", shared_gate="*bf16")
        out[f"gemv down {name} {c.kwargs}"] = compile_sm90(moe_gemv._down_gemv_kernel, types, dict(
            TOPK=K, FP8_W=fp8, HAS_SHARED=False, HAS_GATE=False, **c.kwargs), c.num_warps, 1, divisible=("H", "I"))
print(json.dumps(out))
'''


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel tests run the compiled kernels")
def test_moe_decode_kernels_compile_for_hopper_without_spills():
    results = compile_sm90_in_subprocess(SCRIPT)
    from triton_kernels import moe_gemv

    configs = len(moe_gemv._up_tuned.configs) + len(moe_gemv._down_tuned.configs)
    assert len(results) == 10 + 2 * configs, sorted(results)
    spilling = {name: r for name, r in results.items() if r[1] > 0}
    assert not spilling, f"(registers, spilled bytes) of configs that spill: {spilling}"
