"""Question: how much faster than bf16 cuBLAS are our FP8 GEMMs on the 9B linear shapes, in bytes per second
at decode sizes and TFLOP/s at prefill sizes?

FP8 GEMMs against bf16 cuBLAS (F.linear) on the Qwen3.5-9B linear shapes, same run. Decode-sized M
(1, 2, 16, 32, 64) runs the weight-only kernels (triton_kernels/fp8_weight_only.py), from 17 rows also the
W8A8 GEMMs and the path served (triton_kernels/fp8_few_rows.py: whichever of those timed faster), timed back to
back inside a CUDA graph (no launch overhead, as in decode), reported as bytes moved per second against measured
copy bandwidth; prefill-sized M (8192) runs the W8A8 GEMM
(triton_kernels/fp8_gemm.py) through cuBLAS's block-scaled GEMM where torch has it and through the
Triton kernel, as TFLOP/s, the activation quantization included. The first call per shape and M
bucket autotunes (not timed). At 1-2 rows the two weight-only kernels are also timed apart ("gemv" on the CUDA
cores, "dot" on the tensor cores), besides the one the dispatch picks.

    python bench/fp8_kernels.py [--tokens 1 2 16 32 64 8192]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton.testing  # noqa: E402
from moe_kernels import bench_ms, copy_bandwidth  # noqa: E402

from triton_kernels.fastest import choices  # noqa: E402
from triton_kernels.fp8_few_rows import W8A8_MIN_ROWS, fp8_few_rows_gemm  # noqa: E402
from triton_kernels.fp8_gemm import _cublas_takes, fp8_gemm, fp8_gemm_ref  # noqa: E402
from triton_kernels.fp8_quant import quantize_activations, quantize_fp8  # noqa: E402
from triton_kernels.fp8_weight_only import (  # noqa: E402
    GEMV_MAX_ROWS,
    _launch,
    fp8_weight_only_gemm,
    fp8_weight_only_gemm_ref,
)

SHAPES = {"mlp gate_up": (24576, 4096), "mlp down": (4096, 12288), "attn qkv+gate": (10240, 4096),
          "gdn in_proj": (12352, 4096), "o / out_proj": (4096, 4096)}
TOKENS = [1, 2, 16, 32, 64, 8192]


def layer_weights():
    """(layer, N, K, e4m3 weight, its scales, the bf16 weight) for each 9B shape, on CUDA."""
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda") / k**0.5
        yield name, n, k, *quantize_fp8(w), w.bfloat16()


def in_graph_ms(fn) -> float:
    """Mean time of one call among many captured back to back in one CUDA graph, as decode runs them
    (a replay of a one-call graph mostly measures the replay's launch)."""
    return triton.testing.do_bench_cudagraph(fn, rep=50)


def kernels(m: int, n: int, k: int) -> dict:
    """name -> (fn, reference) of the FP8 paths that serve m rows."""
    paths = {}
    if m <= 64:
        paths["weight-only"] = (fp8_weight_only_gemm, fp8_weight_only_gemm_ref)
        if m <= GEMV_MAX_ROWS:
            paths.update({f"weight-only {kernel}": (functools.partial(one_kernel, kernel), fp8_weight_only_gemm_ref)
                          for kernel in ("gemv", "dot")})
        if m < W8A8_MIN_ROWS:
            return paths
        paths["served (fp8_few_rows)"] = (fp8_few_rows_gemm, fp8_weight_only_gemm_ref)
    paths["w8a8 triton"] = (lambda **kw: fp8_gemm(cublas=False, **kw), fp8_gemm_ref)
    if _cublas_takes(n, k, torch.device("cuda")):
        paths["w8a8 cublas"] = (lambda **kw: fp8_gemm(cublas=True, **kw), fp8_gemm_ref)
    return paths


def one_kernel(kernel: str, *, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor) -> torch.Tensor:
    """The weight-only GEMM through one of its kernels ("gemv" or "dot"), whichever the dispatch would pick."""
    y = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    _launch(x, weight, weight_scale_inv, None, y, kernel)
    return y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, nargs="+", default=TOKENS)
    tokens = ap.parse_args().tokens
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s\n")
    print("| layer | N x K | M | path | bf16 ms | fp8 ms | bf16 / fp8 | fp8 % copy BW | bf16 % copy BW | fp8 TFLOP/s | "
          "bf16 TFLOP/s | fp8 vs ref |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, n, k, q, s, w16 in layer_weights():
        for m in tokens:
            x = torch.randn(m, k, device="cuda").bfloat16()
            # decode sizes run back to back inside a CUDA graph, as decode runs them
            timed = in_graph_ms if m <= 64 else bench_ms
            t16 = timed(lambda: F.linear(x, w16))  # noqa: B023
            for path, (fn, ref_fn) in kernels(m, n, k).items():
                y = fn(x=x, weight=q, weight_scale_inv=s)  # autotunes
                ref = ref_fn(x=x, weight=q, weight_scale_inv=s).float()
                err = ((y.float() - ref).norm() / ref.norm()).item()
                t8 = timed(lambda: fn(x=x, weight=q, weight_scale_inv=s))  # noqa: B023
                bytes8 = n * k + s.numel() * 4 + m * k * 2 + m * n * 2
                bytes16 = n * k * 2 + m * k * 2 + m * n * 2
                flops = 2 * m * n * k
                print(f"| {name} | {n} x {k} | {m} | {path} | {t16:.4f} | {t8:.4f} | {t16 / t8:.2f} | "
                      f"{100 * bytes8 / (t8 * 1e-3) / copy_bw:.0f} | {100 * bytes16 / (t16 * 1e-3) / copy_bw:.0f} | "
                      f"{flops / (t8 * 1e-3) / 1e12:.0f} | {flops / (t16 * 1e-3) / 1e12:.0f} | {err:.1e} |")
    served = {key: name for key, name in choices().items() if key[0] == "fp8_few_rows"}
    if served:
        print("\nfp8_few_rows chose (N, K, row bucket -> path): " +
              ", ".join(f"{n}x{k} m{b} -> {name}" for (_, n, k, b, *_), name in served.items()))
    if max(tokens) <= 64:
        return
    x = torch.randn(8192, 4096, device="cuda").bfloat16()
    t = bench_ms(lambda: quantize_activations(x))
    print(f"\nactivation quantization of 8192 x 4096 bf16: {t:.4f} ms, "
          f"{100 * x.numel() * 3 / (t * 1e-3) / copy_bw:.0f} % of copy bandwidth")


if __name__ == "__main__":
    main()
