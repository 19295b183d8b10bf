"""Decode-size linear layers on one GPU: our skinny matmul vs torch (cuBLAS) in the same run, at
every linear shape of Qwen3.5-9B and Nemotron-H-8B (bf16), M = decode batch rows.

    PYTHONPATH=. python bench/skinny_matmul_bench.py [--m 1 4 32] [--no-tune]

"torch" is what the layer runs without the kernel: F.linear, after the MLP activation kernel where
the layer has one (silu_and_mul for Qwen's gated MLP, relu then square for Nemotron-H's), so the
activation's time counts on both sides. Times are GPU time with a cold L2 (gpu_ms: calls queued
behind a sleep kernel, as under CUDA graphs). "% BW" is the weight bytes over the time, as a share
of the copy bandwidth measured here. The tuning section times other launch configs at M = 1, to
check default_blocks; each case checks ours against the reference (relative L2 error).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.gdn_kernels import copy_bandwidth, gpu_ms, rel_err  # noqa: E402
from triton_kernels import norms  # noqa: E402
from triton_kernels.skinny_matmul import default_blocks, skinny_matmul  # noqa: E402

# (model, layer, N, K, act): read off the models built from configs/ (nn.Linear out/in features).
SHAPES = [
    ("Qwen3.5-9B", "gate_up_proj", 24576, 4096, "none"),
    ("Qwen3.5-9B", "down_proj", 4096, 12288, "silu_mul"),
    ("Qwen3.5-9B", "GDN in_proj", 12352, 4096, "none"),
    ("Qwen3.5-9B", "GDN out_proj / o_proj", 4096, 4096, "none"),
    ("Qwen3.5-9B", "attention qkv_proj", 10240, 4096, "none"),
    ("Qwen3.5-9B", "lm_head", 248320, 4096, "none"),
    ("Nemotron-H-8B", "Mamba2 in_proj", 18560, 4096, "none"),
    ("Nemotron-H-8B", "Mamba2 out_proj", 4096, 8192, "none"),
    ("Nemotron-H-8B", "up_proj", 21504, 4096, "none"),
    ("Nemotron-H-8B", "down_proj", 4096, 21504, "relu2"),
    ("Nemotron-H-8B", "attention qkv_proj", 6144, 4096, "none"),
    ("Nemotron-H-8B", "lm_head", 131072, 4096, "none"),
]
DTYPE = torch.bfloat16


def torch_layer(x: torch.Tensor, w: torch.Tensor, act: str) -> torch.Tensor:
    if act == "silu_mul":
        x = norms.silu_and_mul(gate_up=x)
    elif act == "relu2":
        x = torch.relu(x).square()
    return F.linear(x, w)


def case(n: int, k: int, act: str, m: int, bw: float) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=DTYPE, generator=g) / k ** 0.5
    x = torch.randn(m, 2 * k if act == "silu_mul" else k, device="cuda", dtype=DTYPE, generator=g)
    ours_ms = gpu_ms(lambda: skinny_matmul(x=x, weight=w, act=act))
    torch_ms = gpu_ms(lambda: torch_layer(x, w, act))
    err = rel_err(skinny_matmul(x=x, weight=w, act=act), torch_layer(x, w, act))
    gb = w.numel() * w.element_size()
    return dict(ours_us=ours_ms * 1e3, torch_us=torch_ms * 1e3, speedup=torch_ms / ours_ms,
                ours_bw=100 * gb / (ours_ms * 1e-3) / bw, torch_bw=100 * gb / (torch_ms * 1e-3) / bw, err=err)


def tune(n: int, k: int, act: str, bw: float) -> list[tuple[dict, float]]:
    g = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(n, k, device="cuda", dtype=DTYPE, generator=g)
    x = torch.randn(1, 2 * k if act == "silu_mul" else k, device="cuda", dtype=DTYPE, generator=g)
    out = []
    for bn in (16, 32, 64):
        for bk in (128, 256):
            for warps in (4, 8):
                cfg = {"BLOCK_N": bn, "BLOCK_K": bk, "num_warps": warps, "num_stages": 4}
                ms = gpu_ms(lambda cfg=cfg: skinny_matmul(x=x, weight=w, act=act, blocks=cfg))
                out.append((cfg, 100 * w.numel() * 2 / (ms * 1e-3) / bw))
    return sorted(out, key=lambda t: -t[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", type=int, nargs="+", default=[1, 4, 32])
    p.add_argument("--no-tune", action="store_true")
    a = p.parse_args()
    bw = copy_bandwidth()
    print(f"# Skinny matmul vs torch, {torch.cuda.get_device_name()}, copy bandwidth {bw / 1e12:.2f} TB/s\n")
    print("| model | layer | N x K | act | M | ours µs | torch µs | torch / ours | ours % BW | torch % BW | rel err |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for model, layer, n, k, act in SHAPES:
        for m in a.m:
            r = case(n, k, act, m, bw)
            print(f"| {model} | {layer} | {n}x{k} | {act} | {m} | {r['ours_us']:.1f} | {r['torch_us']:.1f} | "
                  f"{r['speedup']:.2f} | {r['ours_bw']:.0f} | {r['torch_bw']:.0f} | {r['err']:.1e} |")
    if a.no_tune:
        return
    print("\n## Launch configs at M = 1 (top 3 by % BW; default marked)\n")
    for model, layer, n, k, act in SHAPES:
        ranked = tune(n, k, act, bw)
        default = default_blocks(n, 1, torch.device("cuda"))
        cells = [f"{c['BLOCK_N']}/{c['BLOCK_K']}/w{c['num_warps']}: {pct:.0f}%{' (default)' if c == default else ''}"
                 for c, pct in ranked[:3]]
        dflt = next(pct for c, pct in ranked if c == default) if default in [c for c, _ in ranked] else float("nan")
        print(f"- {model} {layer} {n}x{k}: " + "; ".join(cells) + f" | default {dflt:.0f}%")


if __name__ == "__main__":
    main()
