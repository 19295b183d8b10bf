"""Paged attention over a KV pool laid out as vLLM's: `[num_pages, page_size, num_kv_heads, head_dim]`.

A request's KV lives in the pages listed by its row of `block_table` (`[B, max_pages]`);
token position p is at page `block_table[b, p // page_size]`, offset `p % page_size`.
`slot_mapping` gives the flat index `page * page_size + offset` where each new token's K/V go.

Kernels (one launcher each, same keyword signature as the `_ref` beside it):
- `store_kv`: one program per new token writes its K/V rows into the pool; slots < 0 are skipped.
- `paged_attention_extend`: one program per (q head, BLOCK_M new tokens of one request); keys
  below the block's first position need no mask, the diagonal tiles do; blocks past the causal
  edge are never visited. Heaviest blocks are launched first.
- `paged_attention_decode`: flash-decoding. One program per (request, kv head, split) holds all
  G = Hq / Hkv query heads of the group as rows of one tile, so each KV page is read once per
  group; splits of the sequence write (o, lse) partials that a second kernel merges. The split
  count follows the grid (batch x kv heads vs SMs), not the block table's width, so a CUDA graph
  captured with full-width tables launches no more programs than the SMs need.
Softmax runs online in float32 with exp2 and a log2(e)-folded scale.
"""

import functools

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


def store_kv_ref(
    *,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """k, v: [T, Hkv, D]; k_cache, v_cache: [P, page_size, Hkv, D]; slot_mapping: [T]."""
    k_cache.view(-1, *k_cache.shape[2:])[slot_mapping] = k.to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slot_mapping] = v.to(v_cache.dtype)


def _gather_kv(cache: torch.Tensor, pages: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one request: [length, Hkv, D]."""
    return cache[pages].flatten(0, 1)[:length]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, prefix: int) -> torch.Tensor:
    """q: [Lq, Hq, D] at positions prefix..prefix+Lq-1; k, v: [Lk, Hkv, D]. Causal. fp32 math."""
    n_rep = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(n_rep, dim=1)
    v = v.float().repeat_interleave(n_rep, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    q_pos = torch.arange(q.shape[0], device=q.device)[:, None] + prefix
    k_pos = torch.arange(k.shape[0], device=q.device)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def paged_attention_extend_ref(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """New tokens attend to their cached prefix plus themselves (causal). The new tokens' K/V
    must already be stored. q: [T, Hq, D] packed; cu_seqlens_q: [B+1]; seq_lens: [B] total
    tokens per request (prefix + new). Returns o: [T, Hq, D]."""
    o = torch.empty_like(q)
    bounds, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    for i, total in enumerate(lens):
        s, e = bounds[i], bounds[i + 1]
        k = _gather_kv(k_cache, block_table[i], total)
        v = _gather_kv(v_cache, block_table[i], total)
        o[s:e] = _attend(q[s:e], k, v, scale, total - (e - s)).to(q.dtype)
    return o


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


# ----------------------------------------------------------------------------- store_kv


@triton.jit
def _store_kv_kernel(
    k, v, k_cache, v_cache, slot_mapping,
    stride_kt, stride_kh, stride_kd, stride_vt, stride_vh, stride_vd,
    stride_kcp, stride_kcs, stride_kch, stride_kcd, stride_vcp, stride_vcs, stride_vch, stride_vcd,
    PAGE_SIZE: tl.constexpr, NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    H_PAD: tl.constexpr, D_PAD: tl.constexpr,
):
    i_t = tl.program_id(0)
    slot = tl.load(slot_mapping + i_t).to(tl.int64)
    if slot < 0:
        return
    page = slot // PAGE_SIZE
    offset = slot % PAGE_SIZE
    o_h = tl.arange(0, H_PAD)
    o_d = tl.arange(0, D_PAD)
    mask = (o_h < NUM_HEADS)[:, None] & (o_d < HEAD_DIM)[None, :]
    i_t = i_t.to(tl.int64)
    b_k = tl.load(k + i_t * stride_kt + o_h[:, None] * stride_kh + o_d[None, :] * stride_kd, mask=mask)
    b_v = tl.load(v + i_t * stride_vt + o_h[:, None] * stride_vh + o_d[None, :] * stride_vd, mask=mask)
    p_kc = k_cache + page * stride_kcp + offset * stride_kcs
    p_vc = v_cache + page * stride_vcp + offset * stride_vcs
    tl.store(p_kc + o_h[:, None] * stride_kch + o_d[None, :] * stride_kcd,
             b_k.to(k_cache.dtype.element_ty), mask=mask)
    tl.store(p_vc + o_h[:, None] * stride_vch + o_d[None, :] * stride_vcd,
             b_v.to(v_cache.dtype.element_ty), mask=mask)


def store_kv(
    *,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """k, v: [T, Hkv, D] (any strides); k_cache, v_cache: [P, page_size, Hkv, D]; slot_mapping: [T].
    Token t goes to flat slot slot_mapping[t] = page * page_size + offset; negative slots are skipped."""
    t, hkv, d = k.shape
    assert v.shape == k.shape, f"v {tuple(v.shape)} != k {tuple(k.shape)}"
    assert k_cache.shape == v_cache.shape and k_cache.shape[2:] == (hkv, d), (
        f"cache {tuple(k_cache.shape)} does not hold [P, page_size, {hkv}, {d}]")
    assert slot_mapping.shape == (t,), f"slot_mapping {tuple(slot_mapping.shape)} != ({t},)"
    if t == 0:
        return
    _store_kv_kernel[(t,)](
        k, v, k_cache, v_cache, slot_mapping,
        *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride(),
        PAGE_SIZE=k_cache.shape[1], NUM_HEADS=hkv, HEAD_DIM=d,
        H_PAD=triton.next_power_of_2(hkv), D_PAD=triton.next_power_of_2(d),
    )


# ----------------------------------------------------------------------------- shared tile steps


@triton.jit
def _load_kv_tile(p_cache, p_pages, o_n, o_d, seq_len, stride_p, stride_s, stride_d,
                  PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
                  MASK_N: tl.constexpr):
    """Rows o_n ([BLOCK_N] token positions) of one request's K or V for one kv head: [BLOCK_N, D_PAD].
    p_cache points at the head, p_pages at the request's block_table row."""
    if MASK_N:
        m_n = o_n < seq_len
        page = tl.load(p_pages + o_n // PAGE_SIZE, mask=m_n, other=0).to(tl.int64)
    else:
        page = tl.load(p_pages + o_n // PAGE_SIZE).to(tl.int64)
    p = p_cache + (page * stride_p + (o_n % PAGE_SIZE) * stride_s)[:, None] + o_d[None, :] * stride_d
    if MASK_N and HEAD_DIM != D_PAD:
        b = tl.load(p, mask=m_n[:, None] & (o_d < HEAD_DIM)[None, :], other=0.0)
    elif MASK_N:
        b = tl.load(p, mask=m_n[:, None], other=0.0)
    elif HEAD_DIM != D_PAD:
        b = tl.load(p, mask=(o_d < HEAD_DIM)[None, :], other=0.0)
    else:
        b = tl.load(p)
    return b


@triton.jit
def _online_softmax_step(b_q, b_k, b_v, m_i, l_i, acc, qk_scale, mask,
                         MASKED: tl.constexpr, PRECISION: tl.constexpr):
    """One KV tile. m_i: running max of the scores in log2 units (qk_scale = scale * log2 e);
    l_i: running sum; acc: unnormalized output. exp2(s * qk_scale - m) is one FMA and one ex2."""
    s = tl.dot(b_q, tl.trans(b_k.to(b_q.dtype)), input_precision=PRECISION)  # [M, N] raw scores
    if MASKED:
        s = tl.where(mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s * qk_scale - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(b_q.dtype), b_v.to(b_q.dtype), acc * alpha[:, None], input_precision=PRECISION)
    return m_new, l_i, acc


def _precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 else "tf32"


@functools.lru_cache(maxsize=8)
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: small enough to keep tests quick, large enough to split
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check_paged(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                 seq_lens: torch.Tensor) -> tuple[int, int, int, int, int]:
    """(Hq, Hkv, D, page_size, B) after checking the shapes every paged kernel relies on."""
    _, hq, d = q.shape
    _, page_size, hkv, dk = k_cache.shape
    assert v_cache.shape == k_cache.shape, f"v_cache {tuple(v_cache.shape)} != k_cache {tuple(k_cache.shape)}"
    assert dk == d, f"q head_dim {d} != cache head_dim {dk}"
    assert hq % hkv == 0, f"{hq} q heads are not a multiple of {hkv} kv heads"
    assert d <= 256, f"head_dim {d} > 256 is not supported"
    b = seq_lens.shape[0]
    assert block_table.dim() == 2 and block_table.shape[0] == b, (
        f"block_table {tuple(block_table.shape)} needs one row per request ({b})")
    assert block_table.dtype == torch.int32 and seq_lens.dtype == torch.int32, "block_table, seq_lens: int32"
    return hq, hkv, d, page_size, b


# ----------------------------------------------------------------------------- extend


@triton.jit
def _extend_kernel(
    q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, o, qk_scale, num_seqs,
    stride_qt, stride_qh, stride_qd, stride_kp, stride_ks, stride_kh, stride_kd,
    stride_vp, stride_vs, stride_vh, stride_vd, stride_bt, stride_ot, stride_oh, stride_od,
    G: tl.constexpr, PAGE_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    i_h = tl.program_id(0)
    # Blocks are numbered so that request i owns [cu[i] // BLOCK_M + i, cu[i+1] // BLOCK_M + i + 1);
    # the last (largest causal) blocks go first.
    i_blk = tl.num_programs(1) - 1 - tl.program_id(1)
    lo = 0
    hi = num_seqs
    while lo < hi:  # first request whose block range starts after i_blk
        mid = (lo + hi) // 2
        if tl.load(cu_seqlens_q + mid) // BLOCK_M + mid <= i_blk:
            lo = mid + 1
        else:
            hi = mid
    i_seq = lo - 1
    q_start = tl.load(cu_seqlens_q + i_seq)
    q_len = tl.load(cu_seqlens_q + i_seq + 1) - q_start
    i_m = i_blk - (q_start // BLOCK_M + i_seq)
    if i_m * BLOCK_M >= q_len:
        return
    seq_len = tl.load(seq_lens + i_seq)
    prefix = seq_len - q_len
    i_kh = i_h // G

    o_m = i_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, D_PAD)
    m_m = o_m < q_len
    m_qd = m_m[:, None] & (o_d < HEAD_DIM)[None, :]
    p_q = q + q_start.to(tl.int64) * stride_qt + i_h * stride_qh
    b_q = tl.load(p_q + o_m[:, None] * stride_qt + o_d[None, :] * stride_qd, mask=m_qd, other=0.0)

    p_pages = block_table + i_seq.to(tl.int64) * stride_bt
    p_k = k_cache + i_kh * stride_kh
    p_v = v_cache + i_kh * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], dtype=tl.float32)

    q_pos = prefix + o_m  # [BLOCK_M] absolute positions
    diag_lo = (prefix + i_m * BLOCK_M) // BLOCK_N * BLOCK_N
    kv_hi = prefix + tl.minimum((i_m + 1) * BLOCK_M, q_len)
    for start in range(0, diag_lo, BLOCK_N):  # keys every row of the block sees
        b_k = _load_kv_tile(p_k, p_pages, start + o_n, o_d, seq_len, stride_kp, stride_ks, stride_kd,
                            PAGE_SIZE, HEAD_DIM, D_PAD, False)
        b_v = _load_kv_tile(p_v, p_pages, start + o_n, o_d, seq_len, stride_vp, stride_vs, stride_vd,
                            PAGE_SIZE, HEAD_DIM, D_PAD, False)
        m_i, l_i, acc = _online_softmax_step(b_q, b_k, b_v, m_i, l_i, acc, qk_scale, None, False, PRECISION)
    for start in range(diag_lo, kv_hi, BLOCK_N):  # the causal edge
        k_pos = start + o_n
        b_k = _load_kv_tile(p_k, p_pages, k_pos, o_d, seq_len, stride_kp, stride_ks, stride_kd,
                            PAGE_SIZE, HEAD_DIM, D_PAD, True)
        b_v = _load_kv_tile(p_v, p_pages, k_pos, o_d, seq_len, stride_vp, stride_vs, stride_vd,
                            PAGE_SIZE, HEAD_DIM, D_PAD, True)
        mask = (k_pos[None, :] <= q_pos[:, None]) & (k_pos < seq_len)[None, :]
        m_i, l_i, acc = _online_softmax_step(b_q, b_k, b_v, m_i, l_i, acc, qk_scale, mask, True, PRECISION)

    acc = acc / l_i[:, None]
    p_o = o + q_start.to(tl.int64) * stride_ot + i_h * stride_oh
    tl.store(p_o + o_m[:, None] * stride_ot + o_d[None, :] * stride_od, acc.to(o.dtype.element_ty), mask=m_qd)


def _extend_config(num_tokens: int, num_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device) -> dict:
    """BLOCK_M, BLOCK_N, num_warps, num_stages. Hopper-shaped on CUDA; tiny in the interpreter.

    128-row query blocks when they give every SM at least two (q head, block) programs, 64-row
    blocks otherwise (short extends and chunks). At head_dim 256 (H200, bf16, one request):
    prefill T4096 128/64/8 warps is best with 3 stages (0.342 ms vs 0.358 with 2); extend 4096+512
    (64-row blocks) is best with one warpgroup, 64/64/4 warps/2 stages (0.175 ms vs 0.196 with 8)."""
    if device.type != "cuda":
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1)
    d_pad = triton.next_power_of_2(head_dim)
    if dtype == torch.float32:  # for tests: ieee dots run on FMA units; small tiles keep them out of spills
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=2)
    if triton.cdiv(num_tokens, 128) * num_heads < 2 * _num_sms(device):  # too few 128-row blocks
        return dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2 if d_pad >= 256 else 3)
    return dict(BLOCK_M=128, BLOCK_N=64, num_warps=4 if d_pad <= 64 else 8, num_stages=3)


def _paged_attention_extend(*, q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, scale,
                            config: dict | None = None) -> torch.Tensor:
    """paged_attention_extend with an explicit launch config (for tuning)."""
    hq, hkv, d, page_size, b = _check_paged(q, k_cache, v_cache, block_table, seq_lens)
    t = q.shape[0]
    assert cu_seqlens_q.shape == (b + 1,) and cu_seqlens_q.dtype == torch.int32, (
        f"cu_seqlens_q must be int32 [{b + 1}], got {cu_seqlens_q.dtype} {tuple(cu_seqlens_q.shape)}")
    o = torch.empty((t, hq, d), dtype=q.dtype, device=q.device)
    if t == 0 or b == 0:
        return o
    cfg = config or _extend_config(t, hq, d, q.dtype, q.device)
    grid = (hq, t // cfg["BLOCK_M"] + b)
    _extend_kernel[grid](
        q, k_cache, v_cache, block_table, cu_seqlens_q, seq_lens, o, scale * LOG2E, b,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), block_table.stride(0), *o.stride(),
        G=hq // hkv, PAGE_SIZE=page_size, HEAD_DIM=d, D_PAD=triton.next_power_of_2(d),
        PRECISION=_precision(q.dtype), **cfg,
    )
    return o


def paged_attention_extend(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """New tokens attend to their cached prefix plus themselves (causal); their K/V must already
    be stored. q: [T, Hq, D] packed, any strides; cu_seqlens_q: [B+1] int32; seq_lens: [B] int32
    (prefix + new); block_table: [B, max_pages] int32. Returns o: [T, Hq, D] contiguous."""
    return _paged_attention_extend(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                                   cu_seqlens_q=cu_seqlens_q, seq_lens=seq_lens, scale=scale)


# ----------------------------------------------------------------------------- decode


@triton.jit
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


@triton.jit
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
        kv_bytes = 2 * triton.next_power_of_2(head_dim) * dtype.itemsize  # one token's K and V rows
        budget = (32 if programs >= 4 * sms else 64) * 1024
        block_n = min(64, 1 << (budget // kv_bytes).bit_length() - 1)  # >= 32 up to head_dim 256
        stages = 2
    max_splits = max(1, triton.cdiv(triton.cdiv(max_len, block_n), 4))
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
    d_pad = triton.next_power_of_2(d)
    _decode_kernel[(b, hkv, splits)](
        q, k_cache, v_cache, block_table, seq_lens, o, part_o, part_lse, scale * LOG2E, splits,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), block_table.stride(0), *o.stride(),
        NUM_HEADS=hq, G=g, G_PAD=max(16, triton.next_power_of_2(g)), PAGE_SIZE=page_size,
        HEAD_DIM=d, D_PAD=d_pad, SPLIT=splits > 1, PRECISION=_precision(q.dtype), **cfg,
    )
    if splits > 1:
        # all splits in one step on a GPU (<= 128 x 64 floats per program); small steps in the interpreter
        # so tests cover the loop over split blocks
        block_s = min(triton.next_power_of_2(splits), 128 if q.device.type == "cuda" else 8)
        block_d = min(d_pad, 64)
        _decode_reduce_kernel[(b, hq, triton.cdiv(d, block_d))](
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
