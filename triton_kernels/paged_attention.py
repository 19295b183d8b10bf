"""Paged attention over a KV pool laid out as vLLM's: `[num_pages, page_size, num_kv_heads, head_dim]`.

A request's KV lives in the pages listed by its row of `block_table` (`[B, max_pages]`);
token position p is at page `block_table[b, p // page_size]`, offset `p % page_size`.
`slot_mapping` gives the flat index `page * page_size + offset` where each new token's K/V go.

Kernels (one launcher each, same keyword signature as the `_ref` beside it):
- `store_kv`: one program per new token writes its K/V rows into the pool; slots < 0 are skipped.
- `paged_attention_extend`: one program per (q head, BLOCK_M new tokens of one request); keys
  below the block's first position need no mask, the diagonal tiles do; blocks past the causal
  edge are never visited. Heaviest blocks are launched first.
- `paged_attention_decode`: flash-decoding, in paged_decode.py, which shares this module's tile steps.
Softmax runs online in float32 with exp2 and a log2(e)-folded scale.
"""

import functools

import torch
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.host_math import cdiv, next_power_of_2

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


SHORT_ROWS = 8  # rows of at most this many new tokens (decode, verify steps) attend batched in the reference
SCORES_PER_GROUP = 1 << 24  # at most this many float32 scores at once (64 MiB)


def _attend_short_rows(o, q, k_cache, v_cache, block_table, bounds, lens, scale) -> torch.Tensor:
    """paged_attention_extend_ref for rows of at most SHORT_ROWS new tokens: groups of rows at once, each row's
    queries padded to the longest row's and its keys to the group's longest context (masked), instead of a
    gather and two small matmuls per row. Fills and returns o [T, Hq, D]."""
    B, (Hq, D), page_size = len(lens), q.shape[1:], k_cache.shape[1]
    Hkv = k_cache.shape[2]
    M = max(e - s for s, e in zip(bounds, bounds[1:]))
    if M == 0:
        return o
    dev = q.device
    starts = torch.tensor(bounds[:-1], device=dev)
    counts = torch.tensor(bounds[1:], device=dev) - starts
    totals = torch.tensor(lens, device=dev)
    j = torch.arange(M, device=dev)
    tokens = (starts[:, None] + j).clamp(max=q.shape[0] - 1)  # [B, M], pads repeat a real token
    real = j < counts[:, None]
    q_pos = totals[:, None] - counts[:, None] + j  # [B, M]; a pad query sits past its row's keys: none masked out
    group = max(1, SCORES_PER_GROUP // (Hq * M * max(lens)))
    for g0 in range(0, B, group):
        rows = slice(g0, min(B, g0 + group))
        length = max(lens[rows])
        pages = block_table[rows, : -(-length // page_size)].clamp(0, k_cache.shape[0] - 1)
        k = k_cache[pages].flatten(1, 2)[:, :length].float()  # [b, Lk, Hkv, D]
        v = v_cache[pages].flatten(1, 2)[:, :length].float()
        qg = q[tokens[rows]].float().view(-1, M, Hkv, Hq // Hkv, D)  # [b, M, Hkv, rep, D]
        scores = torch.einsum("bmgrd,bkgd->bgrmk", qg, k) * scale
        k_pos = torch.arange(length, device=dev)
        hidden = (k_pos > q_pos[rows, :, None]) | (k_pos >= totals[rows, None, None])  # [b, M, Lk]
        scores = scores.masked_fill(hidden[:, None, None], float("-inf"))
        out = torch.einsum("bgrmk,bkgd->bmgrd", scores.softmax(-1), v).reshape(-1, M, Hq, D)
        keep = real[rows]
        o[tokens[rows][keep]] = out[keep].to(q.dtype)
    return o


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
    if lens and max(e - s for s, e in zip(bounds, bounds[1:])) <= SHORT_ROWS:
        return _attend_short_rows(o, q, k_cache, v_cache, block_table, bounds, lens, scale)
    for i, total in enumerate(lens):
        s, e = bounds[i], bounds[i + 1]
        k = _gather_kv(k_cache, block_table[i], total)
        v = _gather_kv(v_cache, block_table[i], total)
        o[s:e] = _attend(q[s:e], k, v, scale, total - (e - s)).to(q.dtype)
    return o


# ----------------------------------------------------------------------------- store_kv


@cached_launch
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
        H_PAD=next_power_of_2(hkv), D_PAD=next_power_of_2(d),
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


# rows and block-table width (tight in eager steps) vary with the step: not specialized, so a new step shape
# needs no new compile (warm-up.py warms each launch config)
@cached_launch
@triton.jit(do_not_specialize=["num_seqs", "stride_bt"])
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
    d_pad = next_power_of_2(head_dim)
    if dtype == torch.float32:  # for tests: ieee dots run on FMA units; small tiles keep them out of spills
        return dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=2)
    if cdiv(num_tokens, 128) * num_heads < 2 * _num_sms(device):  # too few 128-row blocks
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
        G=hq // hkv, PAGE_SIZE=page_size, HEAD_DIM=d, D_PAD=next_power_of_2(d),
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
