"""Decode-sized FP8 GEMMs on the Qwen3.5-9B shapes, every way this repository can run them, timed
back to back inside CUDA graphs, against bf16 cuBLAS and the measured copy bandwidth: the weight-only
CUDA-core GEMV (summing once after the K loop), the weight-only tensor-core kernel with the weight widened
to bf16 or to fp16, and the W8A8 path (activations quantized, e4m3 x e4m3) through Triton and through
cuBLAS. Picks the decode kernel.

    python bench/fp8_decode_variants.py
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fp8_kernels import in_graph_ms, layer_weights  # noqa: E402
from moe_kernels import copy_bandwidth  # noqa: E402

from triton_kernels.fp8_gemm import _cublas_takes, fp8_gemm  # noqa: E402
from triton_kernels.fp8_weight_only import _launch, fp8_weight_only_gemm_ref  # noqa: E402


def variants(x, q, s):
    m, n = x.shape[0], q.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    out = {}
    if m <= 2:
        out["gemv (cuda cores)"] = lambda: _launch(x, q, s, None, y, "gemv")
    out["dot, fp16 operands"] = lambda: _launch(x, q, s, None, y, "dot", f16_operands=True)
    out["dot, bf16 operands"] = lambda: _launch(x, q, s, None, y, "dot", f16_operands=False)
    out["w8a8 triton"] = lambda: fp8_gemm(x=x, weight=q, weight_scale_inv=s, cublas=False)
    if _cublas_takes(n, x.shape[1], x.device):
        out["w8a8 cublas"] = lambda: fp8_gemm(x=x, weight=q, weight_scale_inv=s, cublas=True)
    return out, y


def main() -> None:
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s\n")
    print("| layer | M | kernel | ms | % copy BW | bf16 cuBLAS ms | bf16 % copy BW | speed-up | "
          "rel err vs weight-only ref |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, n, k, q, s, w16 in layer_weights():
        for m in (1, 2, 16, 64):
            x = torch.randn(m, k, device="cuda").bfloat16()
            t16 = in_graph_ms(lambda: F.linear(x, w16))  # noqa: B023
            ref = fp8_weight_only_gemm_ref(x=x, weight=q, weight_scale_inv=s).float()
            fns, y = variants(x, q, s)
            for label, fn in fns.items():
                result = fn()
                got = (y if result is None else result).float()
                err = ((got - ref).norm() / ref.norm()).item()
                t = in_graph_ms(fn)
                moved = n * k + s.numel() * 4 + m * k * 2 + m * n * 2
                print(f"| {name} | {m} | {label} | {t:.4f} | {100 * moved / (t * 1e-3) / copy_bw:.0f} | {t16:.4f} | "
                      f"{100 * (2 * n * k) / (t16 * 1e-3) / copy_bw:.0f} | {t16 / t:.2f} | {err:.1e} |")


if __name__ == "__main__":
    main()
