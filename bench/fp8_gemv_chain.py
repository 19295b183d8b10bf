"""The FP8 decode GEMV as decode runs it: a chain of Qwen3.5-9B layers' linears at one row (batch-1 decode), each
layer with weights of its own (LAYERS x 218 MB, far past L2), captured in one CUDA graph. The chain's weight
bytes over its time, as a share of the copy bandwidth measured here, is the GEMVs' in-decode efficiency (the
tables of fp8_gemv_variants.py time one shape's calls back to back on one weight).

Variants, each tuned per shape by graph timing before capture:
- "TILES 1": each program one block of BLOCK_N columns, its own K loop (the kernel as it was);
- "TILES t": the same configs with t column blocks a program in one loop, so the next block's first loads are in
  flight while a block ends (fewer, longer programs: a shorter wave tail, one pipeline fill per program);
- "served": the served tuner, which chooses TILES 1, 2 or 4 per shape;
- "before" (when `.before/` holds an older tree): that tree's GEMV kernel and tuner, as a check that TILES 1 of
  this tree is not slower than the kernel it replaced.
Every variant's outputs are checked against the float32 reference.

    PYTHONPATH=. python bench/fp8_gemv_chain.py [--layers 8] [--rows 1]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import torch
import triton

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from moe_kernels import copy_bandwidth  # noqa: E402

from triton_kernels import fp8_weight_only as fwo  # noqa: E402
from triton_kernels.fastest import graph_time  # noqa: E402
from triton_kernels.fp8_quant import quantize_fp8  # noqa: E402

# (name, N, K, gated): a Qwen3.5-9B GDN layer's linears as served (gate_up with silu_and_mul in the epilogue)
LAYER = [("gdn in_proj", 12352, 4096, False), ("out_proj", 4096, 4096, False), ("mlp gate_up", 24576, 4096, True),
         ("mlp down", 4096, 12288, False)]


def tuner(tiles: int):
    """An autotuner over the served configs' block shapes and stages, each with TILES = tiles."""
    configs = [triton.Config({**c.kwargs, "TILES": tiles}, num_warps=c.num_warps)
               for c in fwo._gemv_tuned.configs if c.kwargs["TILES"] == 1]
    return triton.autotune(configs=configs, key=["N", "K", "ROWS", "GATED"],
                           prune_configs_by={"early_config_prune": fwo.gemv_configs_that_fit},
                           do_bench=graph_time)(fwo._gemv_kernel)


def before_tuner():
    """The tuned GEMV of the tree in .before/, or None."""
    path = os.path.join(ROOT, ".before", "triton_kernels", "fp8_weight_only.py")
    if not os.path.exists(path):
        return None
    sys.path.insert(0, os.path.join(ROOT, ".before"))
    spec = importlib.util.spec_from_file_location("before_fp8_weight_only", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._gemv_tuned


def launch(tuned, x, q, s, y, gated: bool) -> None:
    (m, k), n = x.shape, q.shape[0] // (2 if gated else 1)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"] * meta.get("TILES", 1)),)  # noqa: E731
    tuned[grid](x, q, s, y, y, m, n, k, x.stride(0), q.stride(0), s.stride(0), y.stride(0), HAS_BIAS=False,
                GATED=gated, ROWS=triton.next_power_of_2(m))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--rows", type=int, default=1)
    args = parser.parse_args()
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s; {args.layers} layers of {[name for name, *_ in LAYER]}, "
          f"M = {args.rows}\n")
    torch.manual_seed(0)
    x = torch.randn(args.rows, 12288, device="cuda").bfloat16()
    calls, moved = [], 0
    for _ in range(args.layers):
        for name, n, k, gated in LAYER:
            q, s = quantize_fp8(torch.randn(n, k, device="cuda") / k**0.5)
            y = torch.empty(args.rows, n // 2 if gated else n, dtype=x.dtype, device="cuda")
            ref = fwo.fp8_weight_only_gemm_ref(x=x[:, :k], weight=q, weight_scale_inv=s)
            if gated:
                ref = torch.nn.functional.silu(ref[:, : n // 2].float()) * ref[:, n // 2:].float()
            calls.append((name, x[:, :k], q, s, y, gated, ref.float()))
            moved += q.numel() + s.numel() * 4
    variants = {f"TILES {tiles}": tuner(tiles) for tiles in (1, 2, 4, 8)}
    variants["served (its tuner's choice of TILES)"] = fwo._gemv_tuned
    before = before_tuner()
    if before is not None:
        variants["before"] = before
    print("| variant | chain ms | % copy BW | worst rel err | configs chosen (BLOCK_N, BLOCK_K, STAGES, TILES) |")
    print("|---|---|---|---|---|")
    for label, tuned in variants.items():
        for _, xk, q, s, y, gated, _ in calls[: len(LAYER)]:  # tune each shape outside the graph
            launch(tuned, xk, q, s, y, gated)
        torch.cuda.synchronize()

        def chain(tuned=tuned):
            for _, xk, q, s, y, gated, _ in calls:
                launch(tuned, xk, q, s, y, gated)

        ms = triton.testing.do_bench_cudagraph(chain, rep=100)
        chain()
        torch.cuda.synchronize()
        err = max(((y.float() - ref).norm() / ref.norm()).item() for *_, y, _, ref in calls)
        configs = "; ".join(f"{k[:2]}: {v.kwargs.get('BLOCK_N')},{v.kwargs.get('BLOCK_K')},{v.kwargs.get('STAGES')},"
                            f"{v.kwargs.get('TILES', 1)}" for k, v in tuned.cache.items())
        print(f"| {label} | {ms:.4f} | {100 * moved / (ms * 1e-3) / copy_bw:.1f} | {err:.1e} | {configs} |")


if __name__ == "__main__":
    main()
