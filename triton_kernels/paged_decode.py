"""Paged decode attention (flash-decoding) over the KV pool of paged_attention.py, with the torch reference
beside it. One program per (request, kv head, split) holds all G = Hq / Hkv query heads of the group as rows
of one tile, so each KV page is read once per group; splits of the sequence write (o, lse) partials that a
second kernel merges. The split count follows the grid (batch x kv heads vs SMs), not the block table's
width, so a CUDA graph captured with full-width tables launches no more programs than the SMs need.
Softmax runs online in float32 with exp2 and a log2(e)-folded scale (paged_attention._online_softmax_step).
"""

import torch
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.host_math import cdiv, next_power_of_2
from triton_kernels.paged_attention import (
    LOG2E,
    _check_paged,
    _load_kv_tile,
    _num_sms,
    _online_softmax_step,
    _precision,
    paged_attention_extend_ref,
)


def paged_attention_decode_ref(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per request, at position seq_lens - 1. q: [B, Hq, D]. Returns [B, Hq, D]."""
    cu = torch.arange(q.shape[0] + 1, device=q.device)
    return paged_attention_extend_ref(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                                      cu_seqlens_q=cu, seq_lens=seq_lens, scale=scale)


# block-table width (a tight table in eager steps) and split count vary with the batch: not specialized, so a
# new batch needs no new compile
@cached_launch
@triton.jit(do_not_specialize=["num_splits", "stride_bt"])
def _decode_kernel(
    q, k_cache, v_cache, block_table, seq_lens, o, part_o, part_lse, qk_scale, num_splits,
    stride_qb, stride_qh, stride_qd, stride_kp, stride_ks, stride_kh, stride_kd,
    stride_vp, stride_vs, stride_vh, stride_vd, stride_bt, stride_ob, stride_oh, stride_od,
    NUM_HEADS: tl.constexpr, G: tl.constexpr, G_PAD: tl.constexpr, PAGE_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
):
    i_b = tl.program_id(0)
    i_kh = tl.program_id(1)
    i_s = tl.program_id(2)
    seq_len = tl.load(seq_lens + i_b)
    n_tiles = tl.cdiv(seq_len, BLOCK_N)
    tiles_per_split = tl.maximum(tl.cdiv(n_tiles, num_splits), 1)
    t_lo = i_s * tiles_per_split
    t_hi = tl.minimum(t_lo + tiles_per_split, n_tiles)
    if SPLIT:  # noqa: SIM102 (constexpr branch)
        if t_lo >= t_hi:
            return  # the reduce kernel reads only splits that hold tokens

    o_g = tl.arange(0, G_PAD)
    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, D_PAD)
    i_h = i_kh * G + o_g  # [G_PAD] the group's q heads as rows
    m_gd = (o_g < G)[:, None] & (o_d < HEAD_DIM)[None, :]
    p_q = q + i_b.to(tl.int64) * stride_qb
    b_q = tl.load(p_q + i_h[:, None] * stride_qh + o_d[None, :] * stride_qd, mask=m_gd, other=0.0)

    p_pages = block_table + i_b.to(tl.int64) * stride_bt
    p_k = k_cache + i_kh * stride_kh
    p_v = v_cache + i_kh * stride_vh
    m_i = tl.full([G_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([G_PAD], dtype=tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], dtype=tl.float32)
    n_full = seq_len // BLOCK_N
    for t in range(t_lo, tl.minimum(t_hi, n_full)):  # full tiles
        k_pos = t * BLOCK_N + o_n
        b_k = _load_kv_tile(p_k, p_pages, k_pos, o_d, seq_len, stride_kp, stride_ks, stride_kd,
                            PAGE_SIZE, HEAD_DIM, D_PAD, False)
        b_v = _load_kv_tile(p_v, p_pages, k_pos, o_d, seq_len, stride_vp, stride_vs, stride_vd,
                            PAGE_SIZE, HEAD_DIM, D_PAD, False)
        m_i, l_i, acc = _online_softmax_step(b_q, b_k, b_v, m_i, l_i, acc, qk_scale, None, False, PRECISION)
    for t in range(tl.maximum(t_lo, n_full), t_hi):  # the sequence's partial last tile, if in this split
        k_pos = t * BLOCK_N + o_n
        b_k = _load_kv_tile(p_k, p_pages, k_pos, o_d, seq_len, stride_kp, stride_ks, stride_kd,
                            PAGE_SIZE, HEAD_DIM, D_PAD, True)
        b_v = _load_kv_tile(p_v, p_pages, k_pos, o_d, seq_len, stride_vp, stride_vs, stride_vd,
                            PAGE_SIZE, HEAD_DIM, D_PAD, True)
        mask = (k_pos < seq_len)[None, :]
        m_i, l_i, acc = _online_softmax_step(b_q, b_k, b_v, m_i, l_i, acc, qk_scale, mask, True, PRECISION)

    acc = acc / tl.maximum(l_i, 1.0)[:, None]  # l_i >= 1 (the max term is 1) or 0 for seq_len 0: zeros
    if not SPLIT:
        p_o = o + i_b.to(tl.int64) * stride_ob
        tl.store(p_o + i_h[:, None] * stride_oh + o_d[None, :] * stride_od, acc.to(o.dtype.element_ty),
                 mask=m_gd)
    else:
        # partials: part_o [B, Hq, num_splits, HEAD_DIM], part_lse [B, Hq, num_splits] (log2 units)
        row = (i_b * NUM_HEADS + i_h).to(tl.int64) * num_splits + i_s  # [G_PAD]
        tl.store(part_o + row[:, None] * HEAD_DIM + o_d[None, :], acc, mask=m_gd)
        tl.store(part_lse + row, m_i + tl.log2(l_i), mask=o_g < G)


@cached_launch
@triton.jit(do_not_specialize=["num_splits"])
def _decode_reduce_kernel(
    part_o, part_lse, seq_lens, o, num_splits, stride_ob, stride_oh, stride_od,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """One program per (request, q head, BLOCK_D columns): merges the splits that hold tokens."""
    i_b = tl.program_id(0)
    i_h = tl.program_id(1)
    i_d = tl.program_id(2)
    seq_len = tl.load(seq_lens + i_b)
    n_tiles = tl.cdiv(seq_len, BLOCK_N)
    tiles_per_split = tl.maximum(tl.cdiv(n_tiles, num_splits), 1)
    n_splits = tl.cdiv(n_tiles, tiles_per_split)  # splits that hold tokens, as the main kernel made them
    row = (i_b * NUM_HEADS + i_h).to(tl.int64) * num_splits
    o_s = tl.arange(0, BLOCK_S)
    o_d = i_d * BLOCK_D + tl.arange(0, BLOCK_D)
    m_d = o_d < HEAD_DIM

    m = float("-inf")
    for s0 in range(0, n_splits, BLOCK_S):
        lse = tl.load(part_lse + row + s0 + o_s, mask=s0 + o_s < n_splits, other=float("-inf"))
        m = tl.maximum(m, tl.max(lse, 0))
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    den = 0.0
    for s0 in range(0, n_splits, BLOCK_S):
        m_s = s0 + o_s < n_splits
        w = tl.exp2(tl.load(part_lse + row + s0 + o_s, mask=m_s, other=float("-inf")) - m)  # [BLOCK_S]
        b_o = tl.load(part_o + (row + s0 + o_s)[:, None] * HEAD_DIM + o_d[None, :],
                      mask=m_s[:, None] & m_d[None, :], other=0.0)
        acc += tl.sum(w[:, None] * b_o, 0)
        den += tl.sum(w, 0)
    out = acc / tl.maximum(den, 1.0)  # den >= 1 (the max split weighs 1) or 0 for seq_len 0: zeros
    p_o = o + i_b.to(tl.int64) * stride_ob + i_h * stride_oh
    tl.store(p_o + o_d * stride_od, out.to(o.dtype.element_ty), mask=m_d)


# About two resident (request, kv head, split) programs per SM keep HBM busy in decode; see _decode_config.
_DECODE_PROGRAMS_PER_SM = 2


def _decode_config(batch: int, num_kv_heads: int, head_dim: int, max_len: int, dtype: torch.dtype,
                   device: torch.device) -> dict:
    """BLOCK_N, NUM_SPLITS, num_warps, num_stages, without a device sync.

    Splits follow the grid, not the sequence length: P = batch x kv heads programs each split into
    floor(2 SMs / P), so a grid that already gives every SM about two programs stays unsplit and a
    split grid never exceeds 2 SMs programs. max_len (the block table's capacity) only caps the
    count so a split spans at least 4 tiles of it. A CUDA graph captures the table at its full width
    while the sequences may be short: the split count is the tight table's (or the 2 SMs / P bound),
    a split past a sequence's end returns after loading seq_len, the reduce reads only the splits
    that hold tokens, and the partials hold at most 2 SMs x G rows of head_dim floats.

    Half-precision tiles: 64 tokens, cut to (K + V) <= 32 KiB once the grid has >= 4 programs per SM
    (more resident programs, shorter tail); 2 stages; 8 warps on split grids, 4 otherwise.
    H200, head_dim 256, 4 kv heads, bf16: B1·L32k 64 / 66 splits / 8 warps (0.057 ms; 32 / 132 / 4
    warps / 3 stages took 0.062); B64·L4k 64 / 1 / 4 (0.259; 32 / 3 splits took 0.301); B256·L1k
    32 / 1 / 4 / 2 stages (0.259)."""
    sms = _num_sms(device)
    programs = batch * num_kv_heads
    half = device.type == "cuda" and dtype != torch.float32
    if device.type != "cuda":
        block_n, stages = 16, 1
    elif not half:  # float32, for tests: ieee dots on FMA units
        block_n, stages = 16, 2
    else:
        kv_bytes = 2 * next_power_of_2(head_dim) * dtype.itemsize  # one token's K and V rows
        budget = (32 if programs >= 4 * sms else 64) * 1024
        block_n = min(64, 1 << (budget // kv_bytes).bit_length() - 1)  # >= 32 up to head_dim 256
        stages = 2
    max_splits = max(1, cdiv(cdiv(max_len, block_n), 4))
    splits = max(1, min(_DECODE_PROGRAMS_PER_SM * sms // programs, max_splits))
    warps = 8 if half and splits > 1 else 4
    return dict(BLOCK_N=block_n, NUM_SPLITS=splits, num_warps=warps, num_stages=stages)


def _paged_attention_decode(*, q, k_cache, v_cache, block_table, seq_lens, scale,
                            config: dict | None = None) -> torch.Tensor:
    """paged_attention_decode with an explicit launch config (for tuning and tests)."""
    hq, hkv, d, page_size, b = _check_paged(q, k_cache, v_cache, block_table, seq_lens)
    assert q.shape[0] == b, f"decode has one query per request: q {tuple(q.shape)}, {b} requests"
    o = torch.empty((b, hq, d), dtype=q.dtype, device=q.device)
    if b == 0:
        return o
    cfg = dict(config or _decode_config(b, hkv, d, block_table.shape[1] * page_size, q.dtype, q.device))
    splits = cfg.pop("NUM_SPLITS")
    g = hq // hkv
    if splits > 1:
        part_o = torch.empty((b, hq, splits, d), dtype=torch.float32, device=q.device)
        part_lse = torch.empty((b, hq, splits), dtype=torch.float32, device=q.device)
    else:
        part_o = part_lse = o  # unused
    d_pad = next_power_of_2(d)
    _decode_kernel[(b, hkv, splits)](
        q, k_cache, v_cache, block_table, seq_lens, o, part_o, part_lse, scale * LOG2E, splits,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), block_table.stride(0), *o.stride(),
        NUM_HEADS=hq, G=g, G_PAD=max(16, next_power_of_2(g)), PAGE_SIZE=page_size,
        HEAD_DIM=d, D_PAD=d_pad, SPLIT=splits > 1, PRECISION=_precision(q.dtype), **cfg,
    )
    if splits > 1:
        # all splits in one step on a GPU (<= 128 x 64 floats per program); small steps in the interpreter
        # so tests cover the loop over split blocks
        block_s = min(next_power_of_2(splits), 128 if q.device.type == "cuda" else 8)
        block_d = min(d_pad, 64)
        _decode_reduce_kernel[(b, hq, cdiv(d, block_d))](
            part_o, part_lse, seq_lens, o, splits, *o.stride(),
            NUM_HEADS=hq, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_N=cfg["BLOCK_N"], BLOCK_S=block_s, num_warps=4,
        )
    return o


def paged_attention_decode(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per request, at position seq_lens - 1 (its K/V already stored).
    q: [B, Hq, D], any strides; seq_lens: [B] int32 (0 for padding rows: output zeros).
    Returns [B, Hq, D] contiguous."""
    return _paged_attention_decode(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                                   seq_lens=seq_lens, scale=scale)
