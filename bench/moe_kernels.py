"""Question: how near the copy bandwidth (few tokens) and the matmul rate (many) is our fused MoE, against
the torch reference and a dense matmul of the same FLOPs?

Fused MoE on one GPU: ours vs the torch reference (a Python loop over the touched experts) and
vs a dense matmul pair of the same FLOPs, at two expert shapes (bf16 weights and activations):

    Qwen3.5-35B-A3B      E 256, top-8,  H 2048, I 512 (silu-gated experts)
    Qwen3-Next-80B-A3B   E 512, top-10, H 2048, I 512

    PYTHONPATH=. python bench/moe_kernels.py [--no-tune] [--no-profile] [--fp8] [--tokens 1 8 32 256 4096]

Both models have a shared expert as wide as the routed ones, which serving stacks after them
(layers/moe.py): the problems here do too, E + 1 experts and k + 1 slots, the last one expert E
with weight sigmoid(gate). --fp8: the experts in e4m3 with 128 x 128 block scales
(--enable-fp8-experts); bytes count one per weight.

Routing is a softmax top-k of random logits (about balanced). Times are triton's do_bench medians
(L2 flushed before each call). "ours" replays the call from a CUDA graph, as serving replays
decode (host time out of the way); "eager" is the plain call, host time included whenever the GPU
drains its queue. "dense" is [T*k, H] x [H, 2I] then [T*k, I] x [I, H] through torch: the same
FLOPs on one weight, so it shows the matmul ceiling, not the bytes MoE must read. "% BW" divides
the bytes that must move (the touched experts' weights, x, the output) by the time, as a share of
the copy bandwidth measured here; it is the measure for small T. TFLOP/s counts 2 * T*k * H * (2I + I),
the measure for large T. Each case also checks ours against the reference (relative L2 error).
The tuning sections time the up and the down GEMM under other launch configs (the other GEMM
keeps its default), to check the built-in choices.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable

import torch
import triton
import triton.testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.gdn_kernels import kernel_times  # noqa: E402
from triton_kernels import fused_moe as moe  # noqa: E402
from triton_kernels.fp8_quant import quantize_fp8_stacked  # noqa: E402

SHAPES = {"Qwen3.5-35B-A3B": (256, 8, 2048, 512), "Qwen3-Next-80B-A3B": (512, 10, 2048, 512)}
TOKENS = [1, 8, 32, 256, 4096]
DTYPE = torch.bfloat16
DEVICE = "cuda"


def bench_ms(fn: Callable) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/s, counting read + write."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device=DEVICE)
    y = torch.empty_like(x)
    return 2 * x.numel() / (bench_ms(lambda: y.copy_(x)) * 1e-3)


def graphed(fn: Callable) -> Callable:
    """fn captured once in a CUDA graph; returns its replay."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def problem(num_experts: int, top_k: int, hidden: int, inter: int, num_tokens: int, seed: int = 0,
            fp8: bool = False) -> dict:
    """E routed experts and the shared one stacked after them; k routed slots and the shared slot."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    e = num_experts + 1
    w13 = (torch.randn(e, 2 * inter, hidden, generator=g, device=DEVICE) / hidden**0.5).to(DTYPE)
    w2 = (torch.randn(e, hidden, inter, generator=g, device=DEVICE) / inter**0.5).to(DTYPE)
    x = torch.randn(num_tokens, hidden, generator=g, device=DEVICE).to(DTYPE)
    probs = torch.randn(num_tokens, num_experts, generator=g, device=DEVICE).softmax(dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    gate = torch.sigmoid(torch.randn(num_tokens, 1, generator=g, device=DEVICE))
    kw = dict(x=x, w13=w13, w2=w2, topk_weights=torch.cat([weights / weights.sum(-1, keepdim=True), gate], 1),
              topk_ids=torch.cat([ids, torch.full_like(ids[:, :1], num_experts)], 1))
    if fp8:
        (kw["w13"], kw["w13_scale"]), (kw["w2"], kw["w2_scale"]) = (quantize_fp8_stacked(w) for w in (w13, w2))
    return kw


def up_configs() -> list[dict]:
    out = []
    for bm, bn, bk, w, s in [(16, 16, 128, 4, 4), (16, 32, 128, 4, 4), (16, 32, 256, 4, 3), (16, 64, 128, 4, 4),
                             (16, 64, 64, 4, 5), (32, 64, 64, 4, 4), (32, 64, 128, 4, 3), (64, 64, 64, 4, 4),
                             (64, 64, 64, 8, 3), (64, 128, 64, 8, 3), (128, 64, 64, 8, 3), (64, 32, 128, 4, 3),
                             (128, 64, 64, 8, 4), (128, 64, 128, 8, 3), (128, 32, 64, 4, 4), (128, 64, 64, 4, 3),
                             (64, 128, 64, 4, 3)]:
        out.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=s))
    return out


def down_configs() -> list[dict]:
    out = []
    for bm, bn, bk, w, s in [(16, 32, 128, 4, 4), (16, 64, 128, 4, 4), (16, 128, 64, 4, 4), (16, 64, 256, 4, 3),
                             (32, 64, 64, 4, 4), (32, 128, 64, 4, 4), (64, 64, 64, 4, 4), (64, 128, 64, 4, 4),
                             (64, 128, 64, 8, 3), (128, 128, 64, 8, 3), (64, 256, 64, 8, 3), (128, 64, 64, 4, 3),
                             (128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 128, 128, 8, 3), (128, 64, 64, 8, 3)]:
        out.append(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=s))
    return out


def unsorted_configs(which: str) -> list[dict]:
    """The unsorted (decode) path: one row per program, so BLOCK_M stays 16."""
    shapes = [(16, 128, 4, 4), (32, 128, 4, 4), (16, 64, 4, 5), (32, 64, 4, 4)] if which == "up" else \
        [(128, 64, 4, 4), (64, 128, 4, 4), (32, 128, 4, 4), (64, 64, 4, 4)]
    return [dict(BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk, num_warps=w, num_stages=st) for bn, bk, w, st in shapes]


def short(cfg: dict) -> str:
    return f"{cfg['BLOCK_M']}/{cfg['BLOCK_N']}/{cfg['BLOCK_K']} w{cfg['num_warps']} s{cfg['num_stages']}"


def tune_case(name: str, kw: dict, base_ms: float, report) -> None:
    """Each GEMM's launch configs with the other's default; the unsorted path's where the call takes it."""
    rows = kw["topk_ids"].numel()
    up0, down0 = moe._gemm_configs(rows, kw["w13"].shape[0], DTYPE, kw["x"].device)
    unsorted = rows <= moe.UNSORTED_MAX_ROWS
    for which in ("up", "down"):
        configs = unsorted_configs(which) if unsorted else up_configs() if which == "up" else down_configs()
        results = []
        for cfg in configs:
            pair = (cfg, down0) if which == "up" else (up0, cfg)
            call = functools.partial(moe._fused_moe_fwd, **kw, activation="silu", up_config=pair[0],
                                     down_config=pair[1], unsorted=unsorted)
            try:
                results.append((bench_ms(graphed(call)), cfg))
            except Exception as e:  # out of shared memory or registers
                report(f"  {short(cfg)} failed: {type(e).__name__}")
        results.sort(key=lambda r: r[0])
        default = up0 if which == "up" else down0
        report(f"\n{name} {which} GEMM tuning (default {short(default)}: whole call {base_ms:.3f} ms)")
        for ms, cfg in results[:5]:
            report(f"  {ms:.3f} ms  {short(cfg)}")


def case(name: str, shape: tuple, num_tokens: int, copy_bw: float, tune: bool, profile: bool,
         report, fp8: bool = False) -> dict:
    e, k, h, i = shape
    kw = problem(e, k, h, i, num_tokens, seed=num_tokens, fp8=fp8)
    k += 1  # the shared slot
    rows = num_tokens * k
    out = moe.fused_moe(**kw)
    ref = moe.fused_moe_ref(**kw)
    row = dict(model=name, tokens=num_tokens, err=rel_err(out, ref))
    row["ours"] = bench_ms(graphed(lambda: moe.fused_moe(**kw)))
    if rows <= moe.GEMV_MAX_ROWS:  # the few-token paths (FP8: the served call runs the faster, fastest.py)
        for path in ("dot", "gemv"):
            call = functools.partial(moe._fused_moe_fwd, **kw, activation="silu", path=path)
            row[path + "_err"] = rel_err(call(), ref)
            row[path] = bench_ms(graphed(call))
    row["eager"] = bench_ms(lambda: moe.fused_moe(**kw))
    row["ref"] = bench_ms(lambda: moe.fused_moe_ref(**kw))
    a = torch.randn(rows, h, device=DEVICE, dtype=DTYPE)
    b = torch.randn(rows, i, device=DEVICE, dtype=DTYPE)
    w13, w2 = kw["w13"][0].to(DTYPE), kw["w2"][0].to(DTYPE)  # [2I, H], [H, I]
    row["dense"] = bench_ms(lambda: (a @ w13.T, b @ w2.T))
    touched = kw["topk_ids"].unique().numel()
    per_expert = (kw["w13"][0].numel() + kw["w2"][0].numel()) * kw["w13"].element_size()
    if fp8:
        per_expert += (kw["w13_scale"][0].numel() + kw["w2_scale"][0].numel()) * 4
    moved = touched * per_expert + 2 * num_tokens * h * kw["x"].element_size()
    row["touched"] = touched
    for col in ("ours", "dot", "gemv"):
        if col in row:
            row[col + "_bw"] = moved / (row[col] * 1e-3) / copy_bw * 100
    row["bw"] = row["ours_bw"]
    row["tflops"] = 2 * rows * h * 3 * i / (row["ours"] * 1e-3) / 1e12
    if profile:
        times = kernel_times(lambda: moe.fused_moe(**kw))
        report(f"\n{name} T={num_tokens} kernels: {sum(t for _, t in times):.3f} ms in all (warm L2)")
        for kernel, t in times:
            report(f"  {t:.3f} ms  {kernel[:80]}")
    if tune:
        tune_case(f"{name} T={num_tokens}", kw, row["ours"], report)
    return row


def table(rows: list[dict]) -> str:
    lines = ["| model | T | experts touched | ours ms (graph) | eager ms | ref ms | dense ms | ref / ours "
             "| ours / dense | ours % copy BW | ours TFLOP/s | ours vs ref |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['tokens']} | {r['touched']} | {r['ours']:.3f} | {r['eager']:.3f} "
                     f"| {r['ref']:.3f} | {r['dense']:.3f} | {r['ref'] / r['ours']:.1f}x "
                     f"| {r['ours'] / r['dense']:.2f}x | {r['bw']:.1f} | {r['tflops']:.0f} | {r['err']:.1e} |")
    paths = [r for r in rows if "gemv" in r]
    if paths:
        lines += ["", "Few tokens: the two paths the served call chooses between (CUDA-graph replays, L2 flushed)", "",
                  "| model | T | served ms | tensor-core (dot) ms | % BW | GEMV ms | % BW | dot / GEMV | errors vs ref "
                  "(dot / GEMV) |", "|---|---|---|---|---|---|---|---|---|"]
        for r in paths:
            lines.append(f"| {r['model']} | {r['tokens']} | {r['ours']:.4f} | {r['dot']:.4f} | {r['dot_bw']:.1f} "
                         f"| {r['gemv']:.4f} | {r['gemv_bw']:.1f} | {r['dot'] / r['gemv']:.2f} "
                         f"| {r['dot_err']:.1e} / {r['gemv_err']:.1e} |")
    return "\n".join(lines)


def run(report: Callable[[str], None] = print, tune: bool = True, profile: bool = True,
        tokens: list[int] = TOKENS, fp8: bool = False, models: list[str] | None = None) -> list[dict]:
    """models: names (or parts of them) of SHAPES to run; None: all."""
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    report(f"{props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}, triton {triton.__version__}")
    copy_bw = copy_bandwidth()
    report(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)")
    rows = []
    for name, shape in SHAPES.items():
        if models and not any(m in name for m in models):
            continue
        for num_tokens in tokens:
            rows.append(case(name + (" FP8" if fp8 else ""), shape, num_tokens, copy_bw, tune, profile, report, fp8))
            torch.cuda.empty_cache()
    report("")
    report(table(rows))
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-tune", action="store_true", help="skip timing the GEMMs under other launch configs")
    ap.add_argument("--no-profile", action="store_true", help="skip the per-kernel split of each call")
    ap.add_argument("--tokens", type=int, nargs="+", default=TOKENS, help="token counts T")
    ap.add_argument("--fp8", action="store_true", help="e4m3 experts with block scales")
    ap.add_argument("--models", nargs="+", help="only these expert shapes (names or parts: 35B, 80B)")
    args = ap.parse_args()
    rows = run(print, tune=not args.no_tune, profile=not args.no_profile, tokens=args.tokens, fp8=args.fp8,
               models=args.models)
