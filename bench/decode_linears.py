"""16-bit linear layers at decode sizes: cuBLAS (F.linear) against our few-rows tensor-core kernel
(triton_kernels/fp8_weight_only.py: dense_few_rows_gemm, tuned per shape), and the one
layers/linear.py: dense_linear serves. Times are CUDA-graph replays of many calls
(triton.testing.do_bench_cudagraph), so launch overhead is out; % BW divides the weight, x and y
bytes by the time, as a share of the copy bandwidth measured here.

    PYTHONPATH=. python bench/decode_linears.py [--rows 1 8 16]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hybrid_sgl.layers import linear  # noqa: E402
from triton_kernels.fp8_weight_only import dense_few_rows_gemm  # noqa: E402

# (model, layer, N, K)
SHAPES = [("35B-A3B", "GDN in_proj", 12352, 2048), ("35B-A3B", "attn qkv+gate", 9216, 2048),
          ("35B-A3B", "out_proj / o_proj", 2048, 4096), ("9B", "GDN in_proj", 12352, 4096),
          ("9B", "out_proj / o_proj", 4096, 4096), ("9B", "mlp gate_up", 24576, 4096), ("9B", "mlp down", 4096, 12288),
          ("9B", "attn qkv+gate", 10240, 4096)]


def copy_bandwidth() -> float:
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    return 2 * x.numel() / (triton.testing.do_bench(lambda: y.copy_(x)) * 1e-3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16])
    args = ap.parse_args()
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}; copy bandwidth {bw / 1e12:.2f} TB/s\n")
    print("| model | layer | N x K | M | cuBLAS us | % BW | ours us | % BW | cuBLAS / ours | served | max rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model, layer, n, k in SHAPES:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
        for m in args.rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ours = dense_few_rows_gemm(x=x, weight=w)  # tunes
            ref = torch.nn.functional.linear(x, w)
            err = ((ours.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
            cublas = functools.partial(torch.nn.functional.linear, x, w)
            t_cublas = triton.testing.do_bench_cudagraph(cublas, rep=50)
            t_ours = triton.testing.do_bench_cudagraph(functools.partial(dense_few_rows_gemm, x=x, weight=w), rep=50)
            linear.dense_linear(x, w, None)
            served = "ours" if linear.dense_linear_choice(x, w, None) == "ours" else "cuBLAS"
            moved = 2 * (n * k + m * k + m * n)
            p_cublas, p_ours = (f"{moved / (ms * 1e-3) / bw * 100:.0f}" for ms in (t_cublas, t_ours))
            print(f"| {model} | {layer} | {n} x {k} | {m} | {t_cublas * 1e3:.1f} | {p_cublas} | {t_ours * 1e3:.1f} "
                  f"| {p_ours} | {t_cublas / t_ours:.2f} | {served} | {err:.1e} |", flush=True)

if __name__ == "__main__":
    main()
