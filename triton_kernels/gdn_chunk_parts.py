"""The three kernels of the chunked gated delta rule (the math is in gdn_chunk.py).

1. intra  (chunk, value head; parallel): gating and its cumsum gamma within the chunk, k l2norm,
          A = beta k k^T exp(gamma_t - gamma_i) (strictly lower), X = (I + A)^-1 from its 16x16
          diagonal blocks up by matmuls, W = X (beta exp(gamma) K), U = X (beta V)
2. state  (V block, value head, sequence; sequential over the chunks): stores the state entering
          each chunk, V_new = U - W S, S <- exp(gamma_C) S + (exp(gamma_C - gamma) K)^T V_new;
          reads the initial state from the pool slot and writes the final one back; writes the
          state after p tokens into a snapshot slot for every cut p of the sequence
3. output (chunk, value head, V block; parallel): q l2norm, O = exp(gamma) Q S + (Q K^T decay) V_new

Chunks are addressed by virtual index (triton_kernels/varlen.py). Inputs q, k [T, Hk, K],
v [T, Hv, V], a, b [T, Hv] are strided views. Scratch: g_cum [T, Hv] fp32; kn (normalized k)
[T, Hk, K], w [T, Hv, K], u and v_new [T, Hv, V], h [num_virtual_chunks, Hv, K, V] in the input
dtype. Tile offsets are int32 from scalar int64 bases (chunk or sequence start). PREC is
"tf32x3" for float32 inputs (three tensor-core passes, close to float32: "ieee" matmuls of [64, 64]
tiles unroll into thousands of FMAs per thread and spill), else "tf32" (the fp32 dots of the block
inverse). The [64, 64] and [64, 128] matmuls run as Hopper warpgroup MMAs on 4 warps.
"""

import torch
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.gdn_gating import gdn_gate, l2norm
from triton_kernels.varlen import locate_chunk


def _config_space(num_warps: list[int], num_stages: list[int], **meta: list[int]) -> list[triton.Config]:
    points = [{}]
    for key, values in meta.items():
        points = [{**p, key: x} for p in points for x in values]
    return [triton.Config(p, num_warps=w, num_stages=s) for p in points for w in num_warps for s in num_stages]


def _here(configs: list[triton.Config]) -> list[triton.Config]:
    """The autotune space on CUDA; its first point elsewhere (the interpreter cannot benchmark)."""
    return configs if torch.cuda.is_available() else configs[:1]


# 4 warps: one warpgroup for the [64, 64] matmuls, three programs per SM at ~168 registers (8 warps
# need as many registers per thread, so only one program fits); BV slices W and U
INTRA_CONFIGS = _config_space(num_warps=[4], num_stages=[1, 2], BV=[64, 128])
OUTPUT_CONFIGS = _config_space(num_warps=[4, 8], num_stages=[1], BV=[64, 128])


def _tune_real_shapes_only(configs, named_args, **kwargs):
    """Small head dims (test models) take the first config instead of compiling and timing them all."""
    return configs if kwargs["K"] * kwargs["V"] >= 64 * 64 else configs[:1]


@triton.jit
def _dot(b_a, b_b, PREC: tl.constexpr):
    return tl.dot(b_a, b_b, input_precision=PREC)


@triton.jit
def _load_rows(p, o_r, m_r, stride_t, o_c, m_c):
    return tl.load(p + o_r[:, None] * stride_t + o_c[None, :], mask=m_r[:, None] & m_c[None, :], other=0.0)


@triton.jit
def _store_rows(p, o_r, m_r, stride_t, o_c, m_c, b_x):
    tl.store(p + o_r[:, None] * stride_t + o_c[None, :], b_x.to(p.dtype.element_ty),
             mask=m_r[:, None] & m_c[None, :])


@triton.jit
def _scale_rows(b_x, b_r, DT: tl.constexpr):
    return (b_x.to(tl.float32) * b_r[:, None]).to(DT)


@triton.jit
def _diag_block_inverse(b_A3):
    """(I + A)^-1 of a batch of strictly lower-triangular [BC, BC] blocks [NB, BC, BC], by
    elimination: column j of A takes A[i, j] X[j] off every row i > j, and row j of X is final
    when its column comes up. Both extractions are reductions inside a block."""
    o_r = tl.arange(0, b_A3.shape[1])[None, :, None]
    o_c = tl.arange(0, b_A3.shape[2])[None, None, :]
    b_X3 = tl.where(o_r == o_c, 1.0, b_A3 * 0.0)
    for j in range(b_A3.shape[2] - 1):
        b_a = tl.sum(tl.where(o_c == j, b_A3, 0.0), 2)  # [NB, BC]: column j of each A block
        b_x = tl.sum(tl.where(o_r == j, b_X3, 0.0), 1)  # [NB, BC]: row j of each X block
        b_X3 -= b_a[:, :, None] * b_x[:, None, :]
    return b_X3


@triton.jit
def _merge_inverse(b_Y, b_A, m_E, PREC: tl.constexpr):
    """Inverse of a block lower-triangular matrix from those of its diagonal blocks, for every block
    pair [[P, 0], [E, Q]] at once: the inverse is [[P^-1, 0], [-Q^-1 E P^-1, Q^-1]]; b_Y holds the
    diagonal inverses (zero elsewhere) and m_E marks the E blocks in b_A."""
    return b_Y - _dot(b_Y, _dot(tl.where(m_E, b_A, 0.0), b_Y, PREC), PREC)


@cached_launch
@triton.autotune(configs=_here(INTRA_CONFIGS), key=["HK", "HV", "K", "V"],
                 prune_configs_by=dict(early_config_prune=_tune_real_shapes_only))
@triton.jit(do_not_specialize=["N"])
def _gdn_chunk_intra_kernel(
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    g_cum,
    kn,
    w,
    u,
    cu_seqlens,
    stride_k_t,
    stride_k_h,
    stride_v_t,
    stride_v_h,
    stride_a_t,
    stride_b_t,
    N,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREC: tl.constexpr,
):
    """One program per (virtual chunk, value head), on whole [BT, BT] tiles: A from one k k^T; the
    inverses of its four diagonal [BT/4, BT/4] blocks by elimination, side by side; then those of
    the 2x2 block pairs (16 -> 32 -> 64 rows) by two matmuls each; W and U by [BT, BV] slices."""
    tl.static_assert(BT == 64, "the blocked inverse merges four 16-row blocks")
    BC: tl.constexpr = BT // 4
    i_h, i_c = tl.program_id(0) % HV, tl.program_id(0) // HV  # heads fastest: they share k through the cache
    i_n, i_t, bos, eos = locate_chunk(cu_seqlens, i_c, N, BT, BLOCK_N)
    if i_t * BT >= eos - bos:
        return
    t0 = bos + i_t * BT
    i_hk = i_h // (HV // HK)
    o_t = tl.arange(0, BT)
    m_t = o_t < eos - t0
    o_k = tl.arange(0, BK)
    m_k = o_k < K

    k += t0 * stride_k_t + i_hk * stride_k_h
    b_k = _load_rows(k, o_t, m_t, stride_k_t, o_k, m_k)  # [BT, BK], first: its latency overlaps the gating
    DT = b_k.dtype

    # gating; gamma is the cumsum of g within the chunk
    b_g, b_beta = gdn_gate(tl.load(a + (t0 + o_t) * stride_a_t + i_h, mask=m_t, other=0.0),
                           tl.load(b + (t0 + o_t) * stride_b_t + i_h, mask=m_t, other=0.0),
                           tl.load(A_log + i_h).to(tl.float32), tl.load(dt_bias + i_h).to(tl.float32))
    b_gamma = tl.cumsum(tl.where(m_t, b_g, 0.0), 0)
    tl.store(g_cum + (t0 + o_t) * HV + i_h, b_gamma, mask=m_t)

    # A = beta (k k^T) exp(gamma_r - gamma_c) on l2-normalized keys, strictly lower. gamma never
    # grows along the chunk, so the exponent is <= 0 where A is used; the clamp keeps exp finite
    b_rk = tl.rsqrt(tl.sum(b_k.to(tl.float32) * b_k.to(tl.float32), 1) + 1e-6)  # l2norm's eps
    if i_h % (HV // HK) == 0:  # the first value head of each key head stores the normalized keys
        _store_rows(kn + (t0 * HK + i_hk) * K, o_t, m_t, HK * K, o_k, m_k, b_k.to(tl.float32) * b_rk[:, None])
    b_rs = b_rk * b_beta
    b_A = _dot(b_k, tl.trans(b_k), PREC) * b_rs[:, None] * b_rk[None, :]
    b_A *= tl.exp(tl.minimum(b_gamma[:, None] - b_gamma[None, :], 0.0))
    b_A = tl.where(o_t[:, None] > o_t[None, :], b_A, 0.0)

    # X = (I + A)^-1: the inverses of the four diagonal [BC, BC] blocks, then of the 16-row pairs,
    # then of the 32-row halves
    o_b = tl.arange(0, 4)
    m_bb = (o_b[:, None] == o_b[None, :])[:, None, :, None]  # [4, 1, 4, 1]: diagonal blocks
    b_X3 = _diag_block_inverse(tl.sum(tl.where(m_bb, tl.reshape(b_A, (4, BC, 4, BC)), 0.0), 2))
    b_X = tl.reshape(tl.where(m_bb, b_X3[:, :, None, :], 0.0), (BT, BT))
    o_rb, o_cb = (o_t // BC)[:, None], (o_t // BC)[None, :]
    b_X = _merge_inverse(b_X, b_A, (o_rb == o_cb + 1) & (o_rb % 2 == 1), PREC)
    b_X = _merge_inverse(b_X, b_A, (o_rb >= 2) & (o_cb < 2), PREC).to(DT)

    # W = X (beta exp(gamma) K), by column slices of the keys (loaded again, from cache)
    w += (t0 * HV + i_h) * K
    b_s = b_rs * tl.exp(b_gamma)
    for i_k in range(0, K, BV):
        o_s = i_k + tl.arange(0, BV)
        m_s = o_s < K
        b_ks = _scale_rows(_load_rows(k, o_t, m_t, stride_k_t, o_s, m_s), b_s, DT)
        _store_rows(w, o_t, m_t, HV * K, o_s, m_s, _dot(b_X, b_ks, PREC))

    # U = X (beta V)
    v += t0 * stride_v_t + i_h * stride_v_h
    u += (t0 * HV + i_h) * V
    for i_v in range(0, V, BV):
        o_v = i_v + tl.arange(0, BV)
        m_v = o_v < V
        b_v = _scale_rows(_load_rows(v, o_t, m_t, stride_v_t, o_v, m_v), b_beta, DT)
        _store_rows(u, o_t, m_t, HV * V, o_v, m_v, _dot(b_X, b_v, PREC))


@cached_launch
@triton.jit(do_not_specialize=["C"])
def _gdn_chunk_state_kernel(
    kn,
    w,
    u,
    g_cum,
    h,
    v_new,
    ssm_states,
    cu_seqlens,
    state_slots,
    has_initial_state,
    snap_pos,
    snap_slots,
    stride_s,
    C,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    PREC: tl.constexpr,
    HAS_SNAP: tl.constexpr,
):
    """One program per (V block, value head, sequence), looping over the sequence's chunks with
    the state in registers (fp32) as one or two [BK, BV] row blocks (K <= 2 * BK), as fla does.

    With HAS_SNAP, snap_pos / snap_slots [N, C] list the cuts p of each sequence (ascending, -1
    after the last). A cut strictly inside chunk [t0, t0 + BT) is that chunk's update truncated at p,
    as for a sequence ending at p: V_new rows below p - t0 are those of the whole chunk (W and U of a
    row depend only on the rows up to it), decayed from gamma at token p - 1. A cut at the chunk's end
    (the prefix cache's fixed cuts are multiples of 64) stores the updated state, as the SSD kernel
    does. The next cut waits in a register, so a chunk without cuts pays two comparisons."""
    i_v, i_h, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    length = tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos
    slot = tl.load(state_slots + i_n).to(tl.int64)
    i_hk = i_h // (HV // HK)
    o_c = tl.arange(0, BT)
    o_k1 = tl.arange(0, BK)
    o_k2 = BK + o_k1
    o_v = i_v * BV + tl.arange(0, BV)
    m_k1, m_k2, m_v = o_k1 < K, o_k2 < K, o_v < V
    o_h = o_k1[:, None] * V + o_v[None, :]  # [BK, BV] in a [K, V] state
    m_h1 = m_k1[:, None] & m_v[None, :]
    m_h2 = m_k2[:, None] & m_v[None, :]

    # the flag enters as a bound: the interpreter cannot broadcast a scalar bool into a mask
    k_init = K * (tl.load(has_initial_state + i_n) != 0).to(tl.int32)
    p_s = ssm_states + slot * stride_s + i_h * K * V
    b_h1 = tl.load(p_s + o_h, mask=(o_k1 < k_init)[:, None] & m_v[None, :], other=0.0).to(tl.float32)
    if K > BK:
        b_h2 = tl.load(p_s + BK * V + o_h, mask=(o_k2 < k_init)[:, None] & m_v[None, :], other=0.0).to(tl.float32)

    if HAS_SNAP:
        snap_pos += i_n * C
        snap_slots += i_n * C
        i_cut = i_n * 0  # the row's next cut, and its position (-1: none left)
        p_cut = tl.load(snap_pos)

    kn += (bos * HK + i_hk) * K
    w += (bos * HV + i_h) * K
    u += (bos * HV + i_h) * V
    v_new += (bos * HV + i_h) * V
    g_cum += bos * HV + i_h
    h += ((bos // BT + i_n) * HV + i_h) * K * V  # the state entering the sequence's first chunk
    DT = kn.dtype.element_ty
    for i_t in range(tl.cdiv(length, BT)):
        t0 = i_t * BT  # int64, like the trip count
        m_c = o_c < length - t0
        p_h = h + i_t * HV * K * V
        tl.store(p_h + o_h, b_h1.to(h.dtype.element_ty), mask=m_h1)
        b_w = _load_rows(w + t0 * HV * K, o_c, m_c, HV * K, o_k1, m_k1)
        b_wh = _dot(b_w, b_h1.to(DT), PREC)  # [BT, BV]
        if K > BK:
            tl.store(p_h + BK * V + o_h, b_h2.to(h.dtype.element_ty), mask=m_h2)
            b_w = _load_rows(w + t0 * HV * K, o_c, m_c, HV * K, o_k2, m_k2)
            b_wh += _dot(b_w, b_h2.to(DT), PREC)
        b_v = _load_rows(u + t0 * HV * V, o_c, m_c, HV * V, o_v, m_v).to(tl.float32) - b_wh
        _store_rows(v_new + t0 * HV * V, o_c, m_c, HV * V, o_v, m_v, b_v)

        b_g = tl.load(g_cum + t0 * HV + o_c * HV, mask=m_c, other=0.0)
        b_g_last = tl.load(g_cum + (tl.minimum(t0 + BT, length) - 1) * HV)
        p_k = kn + t0 * HK * K + o_c[None, :] * (HK * K)  # keys transposed: [BK, BT]
        if HAS_SNAP:
            # cuts p in (t0, t_end): the update over the chunk's first p - t0 tokens
            t_end = tl.minimum(t0 + BT, length)
            while (p_cut > t0) & (p_cut < t_end):
                b_g_cut = tl.load(g_cum + (p_cut - 1) * HV)
                m_cut = o_c < p_cut - t0
                b_vc = (b_v * tl.where(m_cut, tl.exp(b_g_cut - b_g), 0.0)[:, None]).to(DT)
                b_dc = tl.exp(b_g_cut)
                p_snap = ssm_states + tl.load(snap_slots + i_cut).to(tl.int64) * stride_s + i_h * K * V
                b_kc = tl.load(p_k + o_k1[:, None], mask=m_k1[:, None] & m_cut[None, :], other=0.0)
                b_sc = b_h1 * b_dc + _dot(b_kc, b_vc, PREC)
                tl.store(p_snap + o_h, b_sc.to(ssm_states.dtype.element_ty), mask=m_h1)
                if K > BK:
                    b_kc = tl.load(p_k + o_k2[:, None], mask=m_k2[:, None] & m_cut[None, :], other=0.0)
                    b_sc = b_h2 * b_dc + _dot(b_kc, b_vc, PREC)
                    tl.store(p_snap + BK * V + o_h, b_sc.to(ssm_states.dtype.element_ty), mask=m_h2)
                i_cut += 1
                p_cut = tl.where(i_cut < C, tl.load(snap_pos + tl.minimum(i_cut, C - 1)), -1)
        b_v = (b_v * tl.where(m_c, tl.exp(b_g_last - b_g), 0.0)[:, None]).to(DT)
        b_decay = tl.exp(b_g_last)
        b_k = tl.load(p_k + o_k1[:, None], mask=m_k1[:, None] & m_c[None, :], other=0.0)
        b_h1 = b_h1 * b_decay + _dot(b_k, b_v, PREC)
        if K > BK:
            b_k = tl.load(p_k + o_k2[:, None], mask=m_k2[:, None] & m_c[None, :], other=0.0)
            b_h2 = b_h2 * b_decay + _dot(b_k, b_v, PREC)
        if HAS_SNAP:  # noqa: SIM102 (compiled out without snapshots, where p_cut is undefined)
            if p_cut == t_end:  # a cut at the chunk's end is the updated state: a store, no update of its own
                p_snap = ssm_states + tl.load(snap_slots + i_cut).to(tl.int64) * stride_s + i_h * K * V
                tl.store(p_snap + o_h, b_h1.to(ssm_states.dtype.element_ty), mask=m_h1)
                if K > BK:
                    tl.store(p_snap + BK * V + o_h, b_h2.to(ssm_states.dtype.element_ty), mask=m_h2)
                i_cut += 1
                p_cut = tl.where(i_cut < C, tl.load(snap_pos + tl.minimum(i_cut, C - 1)), -1)

    tl.store(p_s + o_h, b_h1.to(ssm_states.dtype.element_ty), mask=m_h1)
    if K > BK:
        tl.store(p_s + BK * V + o_h, b_h2.to(ssm_states.dtype.element_ty), mask=m_h2)


@cached_launch
@triton.autotune(configs=_here(OUTPUT_CONFIGS), key=["HK", "HV", "K", "V"],
                 prune_configs_by=dict(early_config_prune=_tune_real_shapes_only))
@triton.jit(do_not_specialize=["N"])
def _gdn_chunk_output_kernel(
    q,
    kn,
    v_new,
    h,
    g_cum,
    o,
    cu_seqlens,
    stride_q_t,
    stride_q_h,
    scale,
    N,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREC: tl.constexpr,
):
    """One program per (virtual chunk, value head, V block), V blocks then heads fastest: the programs
    reading one chunk's q and k run together and share them through the cache."""
    NV: tl.constexpr = (V + BV - 1) // BV
    i_v, i_h, i_c = tl.program_id(0) % NV, tl.program_id(0) // NV % HV, tl.program_id(0) // (NV * HV)
    i_n, i_t, bos, eos = locate_chunk(cu_seqlens, i_c, N, BT, BLOCK_N)
    if i_t * BT >= eos - bos:
        return
    t0 = bos + i_t * BT
    i_hk = i_h // (HV // HK)
    o_c = tl.arange(0, BT)
    m_c = o_c < eos - t0
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k, m_v = o_k < K, o_v < V

    b_q = _load_rows(q + t0 * stride_q_t + i_hk * stride_q_h, o_c, m_c, stride_q_t, o_k, m_k)
    DT = b_q.dtype
    b_q = (l2norm(b_q, 1) * scale).to(DT)
    b_k = _load_rows(kn + (t0 * HK + i_hk) * K, o_c, m_c, HK * K, o_k, m_k)
    b_h = tl.load(h + (i_c * HV + i_h).to(tl.int64) * K * V + o_k[:, None] * V + o_v[None, :],
                  mask=m_k[:, None] & m_v[None, :], other=0.0)
    b_g = tl.load(g_cum + t0 * HV + i_h + o_c * HV, mask=m_c, other=0.0)

    b_o = _dot(b_q, b_h, PREC) * tl.exp(b_g)[:, None]  # [BT, BV]: the state's part
    b_s = _dot(b_q, tl.trans(b_k), PREC)  # [BT, BT]
    m_s = (o_c[:, None] >= o_c[None, :]) & m_c[:, None]
    b_s = tl.where(m_s, b_s * tl.exp(tl.minimum(b_g[:, None] - b_g[None, :], 0.0)), 0.0)
    b_v = _load_rows(v_new + (t0 * HV + i_h) * V, o_c, m_c, HV * V, o_v, m_v)
    b_o += _dot(b_s.to(b_v.dtype), b_v, PREC)
    _store_rows(o + (t0 * HV + i_h) * V, o_c, m_c, HV * V, o_v, m_v, b_o)
