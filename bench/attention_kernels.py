"""Question: is our paged attention at least as fast as vLLM's Triton unified_attention, and how near torch
SDPA, in decode, prefill and extend?

Attention kernels on one GPU: ours (paged) vs vLLM's Triton unified_attention (paged, same pool)
vs torch SDPA on the same K/V unpaged, in the same run. Shapes from ANCHORS.md (Qwen3.5-9B full
attention: 16 q heads, 4 kv heads, head_dim 256, bf16, page size 16, pages in random order).

    bash bench/vendor_vllm_attention.sh      # once, where PyPI is reachable (or pass a vllm wheel)
    PYTHONPATH=. python bench/attention_kernels.py [--no-tune] [--no-long]

.vllm_min/ is put on sys.path when present. Decode rows report the share of the measured copy
bandwidth (K+V bytes / time); prefill and extend rows report TFLOP/s (4 * Hq * D per attended
(q, k) pair). Ratios are other's time / ours (> 1: ours is faster). The tuning section times our
kernels under other launch configs, to check the built-in heuristics. The CUDA-graph section replays
decode as a server captures it: the block table at its full width (GRAPH_TABLE_TOKENS / page size
columns, padded with a spare page) whatever the sequences' lengths, next to the tight table.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
if os.path.isdir(os.path.join(ROOT, ".vllm_min")):
    sys.path.append(os.path.join(ROOT, ".vllm_min"))

from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402
from torch.nn.attention.bias import causal_lower_right  # noqa: E402

from triton_kernels import paged_attention as pa  # noqa: E402
from triton_kernels import paged_decode as pd  # noqa: E402

try:
    from triton_kernels import vllm_attention as va
except ImportError as e:
    va, VLLM_MISSING = None, str(e)

HQ, HKV, D, DTYPE, PAGE_SIZE = 16, 4, 256, torch.bfloat16, 16
SCALE = D**-0.5
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
DECODE_CASES = [(1, 32768), (64, 4096), (256, 1024)]  # (batch, context length)
PREFILL_CASES = [(0, 4096), (4096, 512), (0, 32768)]  # (cached prefix, new tokens), one request
GRAPH_TABLE_TOKENS = 262144  # a server's max tokens per request: the captured block table's width
GRAPH_DECODE_CASES = DECODE_CASES + [(1, 1024), (64, 512)]  # + short sequences in the wide table


def bench_ms(fn: Callable) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def ceilings() -> tuple[float, float]:
    """(device copy bandwidth in bytes/s counting read + write, bf16 matmul FLOP/s at 8192^3)."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    copy_bw = 2 * x.numel() / (bench_ms(lambda: y.copy_(x)) * 1e-3)
    a = torch.randn(8192, 8192, dtype=DTYPE, device="cuda")
    b = torch.randn(8192, 8192, dtype=DTYPE, device="cuda")
    peak = 2 * 8192**3 / (bench_ms(lambda: a @ b) * 1e-3)
    return copy_bw, peak


def paged_pool(batch: int, length: int, seed: int = 0):
    """Pool holding `batch` requests of `length` tokens in randomly ordered pages.
    Returns k_cache, v_cache [P + 1, PAGE_SIZE, Hkv, D], block_table [B, L / PAGE_SIZE] int32,
    and the same K and V unpaged: [B, Hkv, L, D]."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages_per = triton.cdiv(length, PAGE_SIZE)
    num_pages = batch * pages_per
    shape = (num_pages + 1, PAGE_SIZE, HKV, D)
    k_cache = torch.randn(shape, generator=g, device="cuda", dtype=DTYPE)
    v_cache = torch.randn(shape, generator=g, device="cuda", dtype=DTYPE)
    block_table = torch.randperm(num_pages, generator=g, device="cuda").int().view(batch, pages_per)

    def unpaged(cache):
        return cache[block_table.long()].flatten(1, 2)[:, :length].transpose(1, 2).contiguous()

    return k_cache, v_cache, block_table, unpaged(k_cache), unpaged(v_cache)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def sdpa(q, k, v, **kw) -> torch.Tensor | None:
    try:
        with sdpa_kernel(SDPA_BACKENDS):
            return F.scaled_dot_product_attention(q, k, v, scale=SCALE, enable_gqa=True, **kw)
    except RuntimeError:  # no non-math SDPA kernel takes these inputs
        return None


def decode_case(batch: int, length: int, copy_bw: float, tune: bool, report) -> dict:
    k_cache, v_cache, block_table, k, v = paged_pool(batch, length)
    q = torch.randn(batch, HQ, D, device="cuda", dtype=DTYPE)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    kw = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, seq_lens=seq_lens, scale=SCALE)
    row = dict(case=f"decode B{batch}·L{length}", unit="% copy BW")
    nbytes = 2 * k.numel() * k.element_size()
    metric = lambda ms: 100 * nbytes / (ms * 1e-3) / copy_bw  # noqa: E731

    ref = sdpa(q[:, :, None], k, v)
    ours = pd.paged_attention_decode(**kw)
    row["ours"] = bench_ms(lambda: pd.paged_attention_decode(**kw))
    row["err"] = max_err(ours, ref[:, :, 0]) if ref is not None else float("nan")
    if ref is not None:
        row["sdpa"] = bench_ms(lambda: sdpa(q[:, :, None], k, v))
    if va is not None:
        cu = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
        paths = {}
        for name, split_k in (("2D", False), ("3D", True)):
            fn = lambda split_k=split_k: va._unified(**kw, cu_seqlens_q=cu, max_seqlen_q=1, split_k=split_k)  # noqa: E731
            row["err_vllm"] = max(row.get("err_vllm", 0.0), max_err(fn(), ours))
            paths[name] = bench_ms(fn)
        row["vllm_path"] = min(paths, key=paths.get)
        row["vllm"] = paths[row["vllm_path"]]
    row.update({f"{k}_metric": metric(row[k]) for k in ("ours", "vllm", "sdpa") if k in row})

    if tune:
        default = pd._decode_config(batch, HKV, D, block_table.shape[1] * PAGE_SIZE, DTYPE, q.device)
        results = []
        for block_n, warps, stages in [(16, 4, 2), (32, 4, 2), (32, 4, 3), (32, 8, 2), (64, 4, 2),
                                       (64, 4, 3), (64, 8, 2), (64, 8, 3)]:
            base = max(1, default["NUM_SPLITS"] * default["BLOCK_N"] // block_n)  # same tokens per split
            for splits in sorted({max(1, base // 2), base, 2 * base, 1}):
                cfg = dict(BLOCK_N=block_n, NUM_SPLITS=splits, num_warps=warps, num_stages=stages)
                try:
                    ms = bench_ms(lambda cfg=cfg: pd._paged_attention_decode(**kw, config=cfg))
                except Exception as e:  # out of shared memory etc.
                    report(f"  decode B{batch}: {cfg} failed: {type(e).__name__}")
                    continue
                results.append((ms, cfg))
        results.sort(key=lambda r: r[0])
        report(f"\ndecode B{batch}·L{length} tuning (default {default}: {row['ours']:.3f} ms)")
        for ms, cfg in results[:5]:
            report(f"  {ms:.3f} ms  {metric(ms):5.1f} % BW  {cfg}")
    return row


def prefill_case(prefix: int, new: int, tune: bool, report) -> dict:
    total = prefix + new
    k_cache, v_cache, block_table, k, v = paged_pool(1, total)
    q = torch.randn(new, HQ, D, device="cuda", dtype=DTYPE)
    cu = torch.tensor([0, new], dtype=torch.int32, device="cuda")
    seq_lens = torch.tensor([total], dtype=torch.int32, device="cuda")
    kw = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, cu_seqlens_q=cu,
              seq_lens=seq_lens, scale=SCALE)
    name = f"prefill T{new}" if prefix == 0 else f"extend {prefix}+{new}"
    row = dict(case=name, unit="TFLOP/s")
    flops = 4 * HQ * D * (new * prefix + new * (new + 1) // 2)
    metric = lambda ms: flops / (ms * 1e-3) / 1e12  # noqa: E731

    q4 = q.transpose(0, 1)[None]  # [1, Hq, T, D]
    mask = dict(is_causal=True) if prefix == 0 else dict(attn_mask=causal_lower_right(new, total))
    ref = sdpa(q4, k, v, **mask)
    ours = pa.paged_attention_extend(**kw)
    row["ours"] = bench_ms(lambda: pa.paged_attention_extend(**kw))
    row["err"] = max_err(ours, ref[0].transpose(0, 1)) if ref is not None else float("nan")
    if ref is not None:
        row["sdpa"] = bench_ms(lambda: sdpa(q4, k, v, **mask))
    if va is not None:
        row["err_vllm"] = max_err(va.vllm_attention_extend(**kw), ours)
        row["vllm"] = bench_ms(lambda: va.vllm_attention_extend(**kw))
        row["vllm_path"] = "2D"
    if prefix == 0:  # the packed varlen flash kernel torch ships, on the new tokens' own K/V (no pool)
        kp, vp = k[0].transpose(0, 1).contiguous(), v[0].transpose(0, 1).contiguous()  # [T, Hkv, D]
        try:
            def flash():
                return torch.ops.aten._flash_attention_forward(q, kp, vp, cu, cu, new, new, 0.0, True, False,
                                                               scale=SCALE)[0]
            row["err_flash"] = max_err(flash(), ours)
            row["flash_varlen"] = bench_ms(flash)
        except Exception as e:  # not built into this torch, or another signature
            report(f"  {name}: aten._flash_attention_forward unavailable: {type(e).__name__}: "
                   f"{str(e).splitlines()[0][:200]}")
    row.update({f"{k}_metric": metric(row[k]) for k in ("ours", "vllm", "sdpa", "flash_varlen") if k in row})

    if tune:
        default = pa._extend_config(new, HQ, D, DTYPE, q.device)
        results = []
        for bm, bn, warps, stages in [(128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 8, 3), (64, 64, 4, 3),
                                      (64, 64, 8, 2), (64, 32, 8, 3), (64, 32, 4, 3), (64, 64, 4, 2)]:
            cfg = dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages)
            try:
                ms = bench_ms(lambda cfg=cfg: pa._paged_attention_extend(**kw, config=cfg))
            except Exception as e:  # out of shared memory / registers
                report(f"  {name}: {cfg} failed: {type(e).__name__}")
                continue
            results.append((ms, cfg))
        results.sort(key=lambda r: r[0])
        report(f"\n{name} tuning (default {default}: {row['ours']:.3f} ms)")
        for ms, cfg in results[:5]:
            report(f"  {ms:.3f} ms  {metric(ms):6.1f} TFLOP/s  {cfg}")
    return row


def graph_ms(fn: Callable) -> float:
    """fn captured in a CUDA graph, timed by replaying it (launch overhead out, as in serving)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    ms = bench_ms(graph.replay)
    del graph
    return ms


def graph_decode_case(batch: int, length: int, copy_bw: float, report) -> None:
    """Decode eager vs in a CUDA graph, with the tight table and with the full-width one."""
    k_cache, v_cache, block_table, k, _ = paged_pool(batch, length)
    q = torch.randn(batch, HQ, D, device="cuda", dtype=DTYPE)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    pad_page = k_cache.shape[0] - 1  # paged_pool leaves the last page unused
    wide = torch.full((batch, GRAPH_TABLE_TOKENS // PAGE_SIZE), pad_page, dtype=torch.int32, device="cuda")
    wide[:, :block_table.shape[1]] = block_table
    nbytes = 2 * k.numel() * k.element_size()
    times, splits, outs = {}, {}, {}
    for name, table_ in (("tight", block_table), ("wide", wide)):
        kw = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=table_, seq_lens=seq_lens, scale=SCALE)
        outs[name] = pd.paged_attention_decode(**kw)
        splits[name] = pd._decode_config(batch, HKV, D, table_.shape[1] * PAGE_SIZE, DTYPE, q.device)["NUM_SPLITS"]
        times[f"eager {name}"] = bench_ms(lambda kw=kw: pd.paged_attention_decode(**kw))
        times[f"graph {name}"] = graph_ms(lambda kw=kw: pd.paged_attention_decode(**kw))
    cells = ", ".join(f"{n} {ms:.4f} ms ({100 * nbytes / (ms * 1e-3) / copy_bw:.1f} %)" for n, ms in times.items())
    report(f"  decode B{batch}·L{length}: {cells}; splits tight {splits['tight']}, wide {splits['wide']}; "
           f"max err wide vs tight {max_err(outs['wide'], outs['tight']):.2e}")


def table(rows: list[dict]) -> str:
    def cell(row, key, fmt):
        return fmt.format(row[key]) if key in row else "n/a"

    lines = ["| case | ours ms | vLLM ms (path) | SDPA ms | vLLM/ours | SDPA/ours | ours | vLLM | SDPA | unit "
             "| max err ours vs SDPA | vLLM vs ours |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        vllm = f"{r['vllm']:.3f} ({r['vllm_path']})" if "vllm" in r else "n/a"
        lines.append(" | ".join([
            f"| {r['case']}", f"{r['ours']:.3f}", vllm, cell(r, "sdpa", "{:.3f}"),
            f"{r['vllm'] / r['ours']:.2f}x" if "vllm" in r else "n/a",
            f"{r['sdpa'] / r['ours']:.2f}x" if "sdpa" in r else "n/a",
            cell(r, "ours_metric", "{:.1f}"), cell(r, "vllm_metric", "{:.1f}"), cell(r, "sdpa_metric", "{:.1f}"),
            r["unit"], f"{r['err']:.2e}", cell(r, "err_vllm", "{:.2e}"),
        ]) + " |")
    flash = [r for r in rows if "flash_varlen" in r]
    if flash:
        lines.append("\nTorch's packed varlen flash kernel on the new tokens' own K/V (no pool, no prefix):")
        for r in flash:
            lines.append(f"- {r['case']}: {r['flash_varlen']:.3f} ms, {r['flash_varlen_metric']:.1f} TFLOP/s "
                         f"({r['flash_varlen'] / r['ours']:.2f}x ours' time), max err vs ours {r['err_flash']:.2e}")
    return "\n".join(lines)


def run(report: Callable[[str], None] = print, tune: bool = True, long: bool = True) -> list[dict]:
    """Benchmark every case; report(line) gets the environment, tuning notes and the markdown table."""
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    vllm_from = "n/a: " + VLLM_MISSING if va is None else os.path.dirname(os.path.dirname(
        sys.modules["vllm"].__file__))
    report(f"{props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}, triton {triton.__version__}; "
           f"vLLM from {vllm_from}")
    copy_bw, peak = ceilings()
    report(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write); bf16 matmul 8192^3 {peak / 1e12:.0f} TFLOP/s")
    report(f"Hq {HQ}, Hkv {HKV}, head_dim {D}, {str(DTYPE).split('.')[-1]}, page size {PAGE_SIZE}")
    rows = []
    for batch, length in DECODE_CASES:
        rows.append(decode_case(batch, length, copy_bw, tune, report))
        torch.cuda.empty_cache()
    report(f"\ndecode eager / in CUDA graphs, tight table / wide table ({GRAPH_TABLE_TOKENS // PAGE_SIZE} pages "
           f"per request); % of copy BW")
    for batch, length in GRAPH_DECODE_CASES:
        graph_decode_case(batch, length, copy_bw, report)
        torch.cuda.empty_cache()
    for prefix, new in PREFILL_CASES:
        if new > 4096 and not long:
            continue
        rows.append(prefill_case(prefix, new, tune, report))
        torch.cuda.empty_cache()
    report("")
    report(table(rows))
    report(f"\n(prefill % of matmul peak = TFLOP/s / {peak / 1e12:.0f})")
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-tune", action="store_true", help="skip timing our kernels under other launch configs")
    ap.add_argument("--no-long", action="store_true", help="skip the T=32768 prefill")
    args = ap.parse_args()
    run(print, tune=not args.no_tune, long=not args.no_long)
