"""The decode-sized GEMM kernels compile for Hopper (sm_90a) under every launch config their autotuners
may pick (the GEMV's after its pruning), and ptxas reports no register spills: the tensor-core kernel
with FP8 weights (fp16 operands, as served up to 16 rows) and with 16-bit weights (dense_linear's
few-rows path), and the FP8 CUDA-core GEMV, plain and gated. On a GPU the autotuner would drop a config
that fails to compile and keep one that spills; here both show.

Needs no GPU (tests/kernels/sm90.py)."""

import pytest
import torch

from tests.kernels.sm90 import compile_sm90_in_subprocess

SCRIPT = r'''
from triton_kernels import fp8_weight_only as f

fp8 = dict(x="*bf16", w="*fp8e4nv", s="*fp32", b="*bf16", y="*bf16", partials="*fp32", arrivals="*i32")
dense = dict(fp8, w="*bf16", s="*bf16")
for c in f._dot_tuned.configs:
    for name, types, scaled in (("fp8", fp8, True), ("bf16", dense, False)):
        consts = dict(HAS_BIAS=False, EXACT_DOT=False, F16_OPERANDS=scaled, M_BUCKET=16, SCALED=scaled,
                      BLOCK_M=16, BLOCK_K=f.FP8_BLOCK, **c.kwargs)
        out[f"dot {name} {c.kwargs} w{c.num_warps} s{c.num_stages}"] = compile_sm90(
            f._dot_kernel, types, consts, c.num_warps, c.num_stages)
for rows, gated in ((1, False), (2, False), (1, True), (2, True)):
    for c in f.gemv_configs_that_fit(f._gemv_tuned.configs, {}, ROWS=rows, GATED=gated):
        out[f"gemv {c.kwargs} w{c.num_warps} rows {rows} gated {gated}"] = compile_sm90(
            f._gemv_kernel, fp8, dict(HAS_BIAS=False, GATED=gated, ROWS=rows, **c.kwargs), c.num_warps, 1,
            divisible=("N", "K"))
print(json.dumps(out))
'''


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel tests run the compiled kernels")
def test_decode_gemms_compile_for_hopper_without_spills():
    from triton_kernels import fp8_weight_only as f

    results = compile_sm90_in_subprocess(SCRIPT)
    fitting = sum(len(f.gemv_configs_that_fit(f._gemv_tuned.configs, {}, ROWS=rows, GATED=gated))
                  for rows in (1, 2) for gated in (False, True))
    assert fitting >= 3 * len(f._gemv_tuned.configs)  # only some gated two-row configs are left out
    assert len(results) == 2 * len(f._dot_tuned.configs) + fitting
    spilling = {name: r for name, r in results.items() if r[1] > 0}
    assert not spilling, f"(registers, spilled bytes) of configs that spill: {spilling}"
