"""How much of a decode step do the gaps between dependent kernels cost, and does programmatic dependent
launch (PDL, sm_90+) win it back? A chain shaped like the GDN layers of Qwen3.5-35B-A3B at batch 1:
30 x (in_proj 12352 x 2048, then out_proj 2048 x 4096 on the first 4096 outputs), a different weight
per layer (2 GB in all, so every weight streams from memory), captured in one CUDA graph.

    PYTHONPATH=. python bench/pdl_chain.py

Variants of one plain Triton GEMV kernel (bf16 weights, float32 sums):
- plain: each launch waits for the previous one to finish, as every decode kernel does now;
- pdl: launched with PDL; each program lets the next kernel launch at its start, then waits for the
  previous kernel's writes (griddepcontrol) before it reads x;
- pdl + prefetch: the same, and before waiting each program asks L2 for its weight rows, so a kernel's
  weight stream starts while the previous kernel finishes.
cuBLAS (torch.mv) runs the same chain for scale. "% copy BW" divides the chain's weight bytes by its
time, as a share of the copy bandwidth measured here. Every variant's output must equal plain's.
"""

from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl
import triton.testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.moe_kernels import copy_bandwidth  # noqa: E402

LAYERS, HIDDEN, IN_PROJ, VALUE = 30, 2048, 12352, 4096
BLOCK_N, BLOCK_K = 16, 256
LINE = 128  # bytes per L2 prefetch


@triton.jit
def prefetch_l2(base, nbytes, LINES: tl.constexpr):
    """Asks L2 for the nbytes from base, one line per lane (LINES lanes; the spare ones repeat the last
    line): a hint in inline PTX that changes no value any load reads."""
    o = tl.minimum(tl.arange(0, LINES).to(tl.int64) * 128, nbytes - 1)  # LINE bytes apart
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l",
                              [base.to(tl.pointer_type(tl.int8)) + o], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _gemv_kernel(x, w, y, N, K, PDL: tl.constexpr, PREFETCH: tl.constexpr, LINES: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[N] = w[N, K] @ x[K] (w contiguous), BLOCK_N rows per program."""
    pid = tl.program_id(0)
    o_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < N
    if PDL:
        if PREFETCH:  # this program's rows are one contiguous span of BLOCK_N * K * 2 bytes
            prefetch_l2(w + pid.to(tl.int64) * BLOCK_N * K, tl.minimum(N - pid * BLOCK_N, BLOCK_N) * K * 2, LINES)
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # the previous kernel's writes (x) are visible past here
    o_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        b_x = tl.load(x + k0 + o_k, mask=k0 + o_k < K, other=0.0).to(tl.float32)
        b_w = tl.load(w + o_n.to(tl.int64)[:, None] * K + k0 + o_k[None, :],
                      mask=m_n[:, None] & (k0 + o_k < K)[None, :], other=0.0)
        acc += b_w.to(tl.float32) * b_x[None, :]
    tl.store(y + o_n, tl.sum(acc, 1).to(y.dtype.element_ty), mask=m_n)


def gemv(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, pdl: bool, prefetch: bool) -> None:
    n, k = w.shape
    lines = triton.next_power_of_2(triton.cdiv(BLOCK_N * k * w.element_size(), LINE))
    _gemv_kernel[(triton.cdiv(n, BLOCK_N),)](x, w, y, n, k, PDL=pdl, PREFETCH=prefetch, LINES=lines,
                                             BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=4, launch_pdl=pdl)


def chain(weights: list[tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor, bufs: tuple[torch.Tensor, torch.Tensor],
          variant: str) -> torch.Tensor:
    """x [HIDDEN] through every layer: in_proj, then out_proj of the first VALUE outputs."""
    mid, out = bufs
    for a, b in weights:
        if variant == "cublas":
            torch.mv(a, x, out=mid)
            torch.mv(b, mid[:VALUE], out=out)
        else:
            pdl, prefetch = variant != "plain", variant == "pdl + prefetch"
            gemv(x, a, mid, pdl, prefetch)
            gemv(mid, b, out, pdl, prefetch)
        x = out
    return out


def main() -> None:
    copy_bw = copy_bandwidth()
    g = torch.Generator(device="cuda").manual_seed(0)
    weights = [(torch.randn(IN_PROJ, HIDDEN, device="cuda", generator=g).bfloat16() / HIDDEN ** 0.5,
                torch.randn(HIDDEN, VALUE, device="cuda", generator=g).bfloat16() / VALUE ** 0.5)
               for _ in range(LAYERS)]
    nbytes = sum(a.numel() * 2 + b.numel() * 2 for a, b in weights)
    x = torch.randn(HIDDEN, device="cuda", generator=g).bfloat16()
    bufs = (torch.empty(IN_PROJ, device="cuda", dtype=torch.bfloat16),
            torch.empty(HIDDEN, device="cuda", dtype=torch.bfloat16))
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s; {2 * LAYERS} GEMVs, {nbytes / 1e9:.2f} GB of weights\n")
    print("| variant | chain ms | us per GEMV | % copy BW | vs plain | output against plain |")
    print("|---|---|---|---|---|---|")
    plain_out, plain_ms = None, None
    for variant in ("plain", "pdl", "pdl + prefetch", "cublas"):
        try:
            out = chain(weights, x, bufs, variant).clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                chain(weights, x, bufs, variant)
            bufs[1].zero_()
            graph.replay()
            torch.cuda.synchronize()
            replayed = torch.equal(bufs[1], out)  # the replay recomputes the eager result
            ms = triton.testing.do_bench(graph.replay, warmup=5, rep=50, return_mode="median")
        except Exception as err:  # PDL needs sm_90 and a Triton that launches it
            print(f"| {variant} | failed: {type(err).__name__}: {str(err)[:100]} | | | | |")
            continue
        if plain_out is None:
            plain_out, plain_ms = out, ms
        err = ((out.float() - plain_out.float()).norm() / plain_out.float().norm()).item()
        against = ("equal" if torch.equal(out, plain_out) else f"rel. err {err:.1e}") + \
            ("" if replayed else "; graph replay differs from eager")
        print(f"| {variant} | {ms:.3f} | {1000 * ms / (2 * LAYERS):.2f} | {100 * nbytes / (ms * 1e-3) / copy_bw:.1f} "
              f"| {plain_ms / ms:.2f} | {against} |")

if __name__ == "__main__":
    main()
