"""Routed experts for a few tokens (decode at small batch): one program per (assignment, column tile)
reads its expert's weight rows straight from topk_ids, with no sort by expert. At T*k <= 32 the
assignments rarely share an expert, so the sorted path's grouping saves nothing, while its sort kernel
and its few, wide programs leave most of the memory bandwidth unused.

  up:   inter[a] = act(x[a // k] @ w13[e(a)]^T)       [T*k, I] in x's dtype
  down: rows[a]  = w[a] * (inter[a] @ w2[e(a)]^T)     [T*k, H] in x's dtype
Products are summed in float32 over BLOCK_K-wide slices (GEMV-shaped: no tensor cores at one row).
"""

import functools

import torch
import triton
import triton.language as tl
import triton.testing

MAX_ROWS = 32  # T*k up to which fused_moe takes this path


@triton.jit
def _gemv_up_kernel(x, w13, inter, topk_ids, stride_x, stride_we, stride_wn, stride_inter, H, I, NUM_ROWS,
                    TOPK: tl.constexpr, GATED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (a, n-tile): inter[a, n-tile] = act of x[a // TOPK] times the expert's gate (and up) rows.
    NUM_ROWS (T*k) only keys the autotuner."""
    a, i_n = tl.program_id(0), tl.program_id(1)
    e = tl.load(topk_ids + a).to(tl.int64)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    m_n = o_n < I
    p_x = x + (a // TOPK).to(tl.int64) * stride_x + o_k
    p_w = w13 + e * stride_we + o_n[:, None].to(tl.int64) * stride_wn + o_k[None, :]  # [BLOCK_N, BLOCK_K]
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        m_k = k0 + o_k < H
        b_x = tl.load(p_x + k0, mask=m_k, other=0.0).to(tl.float32)[None, :]
        b_w = tl.load(p_w + k0, mask=m_n[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(b_w * b_x, 1)
        if GATED:
            b_u = tl.load(p_w + I * stride_wn + k0, mask=m_n[:, None] & m_k[None, :], other=0.0).to(tl.float32)
            acc_up += tl.sum(b_u * b_x, 1)
    if GATED:
        b_h = acc * tl.sigmoid(acc) * acc_up
    else:
        b_h = tl.maximum(acc, 0.0)
        b_h = b_h * b_h
    tl.store(inter + a.to(tl.int64) * stride_inter + o_n, b_h.to(inter.dtype.element_ty), mask=m_n)


@triton.jit
def _gemv_down_kernel(inter, w2, rows, topk_ids, topk_weights, stride_inter, stride_we, stride_wh, stride_rows,
                      H, I, NUM_ROWS, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program (a, n-tile): rows[a, n-tile] = w[a] * inter[a] @ the expert's w2 rows n-tile."""
    a, i_n = tl.program_id(0), tl.program_id(1)
    e = tl.load(topk_ids + a).to(tl.int64)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    m_n = o_n < H
    p_a = inter + a.to(tl.int64) * stride_inter + o_k
    p_w = w2 + e * stride_we + o_n[:, None].to(tl.int64) * stride_wh + o_k[None, :]  # [BLOCK_N, BLOCK_K]
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        m_k = k0 + o_k < I
        b_a = tl.load(p_a + k0, mask=m_k, other=0.0).to(tl.float32)[None, :]
        b_w = tl.load(p_w + k0, mask=m_n[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        acc += tl.sum(b_w * b_a, 1)
    acc *= tl.load(topk_weights + a)
    tl.store(rows + a.to(tl.int64) * stride_rows + o_n, acc.to(rows.dtype.element_ty), mask=m_n)


def _tuned(kernel, tiles: list[tuple[int, int, int]]):
    """CUDA: the kernel autotuned over (BLOCK_N, BLOCK_K, num_warps) per weight shape and T*k. Narrow
    column tiles make many programs (a batch-1 step has only k experts' weights to stream), wide K
    slices keep many bytes in flight per program."""
    configs = [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w) for n, k, w in tiles]
    bench = functools.partial(triton.testing.do_bench, warmup=5, rep=20)
    return triton.autotune(configs=configs, key=["H", "I", "NUM_ROWS"], do_bench=bench)(kernel)


_gemv_up_tuned = _tuned(_gemv_up_kernel, [(8, 512, 4), (16, 256, 4), (16, 512, 4), (32, 256, 8), (32, 512, 8)])
_gemv_down_tuned = _tuned(_gemv_down_kernel, [(8, 512, 4), (16, 512, 4), (32, 256, 4), (32, 512, 8), (64, 256, 8)])
_INTERPRETER = dict(BLOCK_N=16, BLOCK_K=32)


def moe_gemv(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
             topk_ids: torch.Tensor, gated: bool) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I or I, H]; w2 [E, H, I]; topk_weights [T, k] float32; topk_ids [T, k] ->
    the weighted expert rows [T*k, H] in x's dtype, row t * k + j. No host sync (graph-safe)."""
    t, h = x.shape
    i, k = w2.shape[2], topk_ids.shape[1]
    rows = t * k
    ids = topk_ids.reshape(-1).contiguous()
    weights = topk_weights.reshape(-1).float().contiguous()
    inter = torch.empty((rows, i), dtype=x.dtype, device=x.device)
    out = torch.empty((rows, h), dtype=x.dtype, device=x.device)
    up_args = (x, w13, inter, ids, x.stride(0), w13.stride(0), w13.stride(1), inter.stride(0), h, i, rows)
    down_args = (inter, w2, out, ids, weights, inter.stride(0), w2.stride(0), w2.stride(1), out.stride(0), h, i, rows)
    if x.is_cuda:
        _gemv_up_tuned[lambda meta: (rows, triton.cdiv(i, meta["BLOCK_N"]))](*up_args, TOPK=k, GATED=gated)
        _gemv_down_tuned[lambda meta: (rows, triton.cdiv(h, meta["BLOCK_N"]))](*down_args)
    else:
        n = _INTERPRETER["BLOCK_N"]
        _gemv_up_kernel[(rows, triton.cdiv(i, n))](*up_args, TOPK=k, GATED=gated, **_INTERPRETER)
        _gemv_down_kernel[(rows, triton.cdiv(h, n))](*down_args, **_INTERPRETER)
    return out
