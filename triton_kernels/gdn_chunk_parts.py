"""The three kernels of the chunked gated delta rule (the math is in gdn_chunk.py).

1. intra  (chunk, value head; parallel): gating and its cumsum gamma within the chunk, k l2norm,
          A = beta k k^T exp(gamma_t - gamma_i) (strictly lower), X = (I + A)^-1 by 16x16 blocks,
          W = X (beta exp(gamma) K), U = X (beta V)
2. state  (V block, value head, sequence; sequential over the chunks): stores the state entering
          each chunk, V_new = U - W S, S <- exp(gamma_C) S + (exp(gamma_C - gamma) K)^T V_new;
          reads the initial state from the pool slot and writes the final one back
3. output (chunk, value head, V block; parallel): q l2norm, O = exp(gamma) Q S + (Q K^T decay) V_new

Chunks are addressed by virtual index (triton_kernels/varlen.py). Inputs q, k [T, Hk, K],
v [T, Hv, V], a, b [T, Hv] are strided views. Scratch: g_cum [T, Hv] fp32; kn (normalized k)
[T, Hk, K], w [T, Hv, K], u and v_new [T, Hv, V], h [num_virtual_chunks, Hv, K, V] in the input
dtype. Tile offsets are int32 from scalar int64 bases (chunk or sequence start). PREC is
"ieee" for float32 inputs (to match the float32 reference closely), else "tf32" (the fp32 dots of
the block inverse).
"""

import torch
import triton
import triton.language as tl

from triton_kernels.gdn_gating import gdn_gate, l2norm
from triton_kernels.varlen import locate_chunk


def _configs(num_warps: list[int], num_stages: list[int], **meta: list[int]) -> list[triton.Config]:
    """The autotune space on CUDA; its first point elsewhere (the interpreter cannot benchmark)."""
    points = [{}]
    for key, values in meta.items():
        points = [{**p, key: x} for p in points for x in values]
    configs = [triton.Config(p, num_warps=w, num_stages=s) for p in points for w in num_warps for s in num_stages]
    return configs if torch.cuda.is_available() else configs[:1]


def _tune_real_shapes_only(configs, named_args, **kwargs):
    """Small head dims (test models) take the first config instead of compiling and timing them all."""
    return configs if kwargs["K"] * kwargs["V"] >= 64 * 64 else configs[:1]


@triton.jit
def _dot(b_a, b_b, PREC: tl.constexpr):
    return tl.dot(b_a, b_b, input_precision=PREC)


@triton.jit
def _gate_rows(a, b, o_r, m_r, stride_a_t, stride_b_t, b_A_log, b_dt_bias, carry):
    """(gamma, beta) of BC rows; gamma continues the chunk's cumsum of g from `carry`."""
    b_g, b_beta = gdn_gate(tl.load(a + o_r * stride_a_t, mask=m_r, other=0.0),
                           tl.load(b + o_r * stride_b_t, mask=m_r, other=0.0), b_A_log, b_dt_bias)
    return tl.cumsum(tl.where(m_r, b_g, 0.0), 0) + carry, b_beta


@triton.jit
def _last(b_x):
    return tl.sum(tl.where(tl.arange(0, b_x.shape[0]) == b_x.shape[0] - 1, b_x, 0.0), 0)


@triton.jit
def _load_rows(p, o_r, m_r, stride_t, o_c, m_c):
    return tl.load(p + o_r[:, None] * stride_t + o_c[None, :], mask=m_r[:, None] & m_c[None, :], other=0.0)


@triton.jit
def _store_rows(p, o_r, m_r, stride_t, o_c, m_c, b_x):
    tl.store(p + o_r[:, None] * stride_t + o_c[None, :], b_x.to(p.dtype.element_ty),
             mask=m_r[:, None] & m_c[None, :])


@triton.jit
def _decay(b_A, b_gamma_r, b_gamma_c, b_beta_r, DIAG: tl.constexpr):
    """beta_r * A * exp(gamma_r - gamma_c); of a diagonal block only the strictly lower part.
    gamma never grows along the chunk, so the exponent is <= 0 wherever the block is used; the clamp
    keeps exp finite above the diagonal."""
    b_A = b_A * tl.exp(tl.minimum(b_gamma_r[:, None] - b_gamma_c[None, :], 0.0))
    if DIAG:
        o_i = tl.arange(0, b_A.shape[0])
        b_A = tl.where(o_i[:, None] > o_i[None, :], b_A, 0.0)
    return b_A * b_beta_r[:, None]


@triton.jit
def _unit_lower_inverse(b_A):
    """(I + A)^-1 of a strictly lower-triangular [BC, BC] block, by forward substitution: row i of
    X = (I + A)^-1 - I is -A[i] - sum_j A[i, j] X[j]."""
    o_i = tl.arange(0, b_A.shape[0])
    b_X = -b_A  # rows 0 and 1 are final already
    for i in range(2, b_A.shape[0]):
        b_a = tl.sum(tl.where((o_i == i)[:, None], -b_A, 0.0), 0)
        b_a = b_a + tl.sum(b_a[:, None] * b_X, 0)
        b_X = tl.where((o_i == i)[:, None], b_a[None, :], b_X)
    return b_X + (o_i[:, None] == o_i[None, :]).to(tl.float32)


@triton.jit
def _scale_rows(b_x, b_r, DT: tl.constexpr):
    return (b_x.to(tl.float32) * b_r[:, None]).to(DT)


@triton.jit
def _store_block_product(p, o_r0, o_r1, o_r2, o_r3, m_r0, m_r1, m_r2, m_r3, stride_t, o_c, m_c,
                         b_X00, b_X10, b_X11, b_X20, b_X21, b_X22, b_X30, b_X31, b_X32, b_X33,
                         b_y0, b_y1, b_y2, b_y3, PREC: tl.constexpr):
    """Stores the four row blocks of X Y, X lower block-triangular, Y as four row blocks."""
    _store_rows(p, o_r0, m_r0, stride_t, o_c, m_c, _dot(b_X00, b_y0, PREC))
    _store_rows(p, o_r1, m_r1, stride_t, o_c, m_c, _dot(b_X10, b_y0, PREC) + _dot(b_X11, b_y1, PREC))
    _store_rows(p, o_r2, m_r2, stride_t, o_c, m_c,
                _dot(b_X20, b_y0, PREC) + _dot(b_X21, b_y1, PREC) + _dot(b_X22, b_y2, PREC))
    _store_rows(p, o_r3, m_r3, stride_t, o_c, m_c,
                _dot(b_X30, b_y0, PREC) + _dot(b_X31, b_y1, PREC) + _dot(b_X32, b_y2, PREC) + _dot(b_X33, b_y3, PREC))


@triton.autotune(configs=_configs(num_warps=[1, 2, 4], num_stages=[1], BKS=[32, 64]), key=["HK", "HV", "K", "V"],
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
    BKS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREC: tl.constexpr,
):
    """One program per (virtual chunk, value head). The chunk is four row blocks of BC = BT / 4;
    the blocks (I, J) of A and X stay in registers, K and V are walked in slices of BKS."""
    BC: tl.constexpr = BT // 4
    i_c, i_h = tl.program_id(0), tl.program_id(1)
    i_n, i_t, bos, eos = locate_chunk(cu_seqlens, i_c, N, BT, BLOCK_N)
    if i_t * BT >= eos - bos:
        return
    t0 = bos + i_t * BT
    rows = eos - t0  # valid rows in this chunk
    i_hk = i_h // (HV // HK)
    o_r0 = tl.arange(0, BC)
    o_r1, o_r2, o_r3 = o_r0 + BC, o_r0 + 2 * BC, o_r0 + 3 * BC
    m_r0, m_r1, m_r2, m_r3 = o_r0 < rows, o_r1 < rows, o_r2 < rows, o_r3 < rows
    o_s = tl.arange(0, BKS)

    # gating; gamma is the cumsum of g within the chunk
    a += t0 * stride_a_t + i_h
    b += t0 * stride_b_t + i_h
    b_A_log = tl.load(A_log + i_h).to(tl.float32)
    b_dt_bias = tl.load(dt_bias + i_h).to(tl.float32)
    b_g0, b_b0 = _gate_rows(a, b, o_r0, m_r0, stride_a_t, stride_b_t, b_A_log, b_dt_bias, 0.0)
    b_g1, b_b1 = _gate_rows(a, b, o_r1, m_r1, stride_a_t, stride_b_t, b_A_log, b_dt_bias, _last(b_g0))
    b_g2, b_b2 = _gate_rows(a, b, o_r2, m_r2, stride_a_t, stride_b_t, b_A_log, b_dt_bias, _last(b_g1))
    b_g3, b_b3 = _gate_rows(a, b, o_r3, m_r3, stride_a_t, stride_b_t, b_A_log, b_dt_bias, _last(b_g2))
    g_cum += t0 * HV + i_h
    tl.store(g_cum + o_r0 * HV, b_g0, mask=m_r0)
    tl.store(g_cum + o_r1 * HV, b_g1, mask=m_r1)
    tl.store(g_cum + o_r2 * HV, b_g2, mask=m_r2)
    tl.store(g_cum + o_r3 * HV, b_g3, mask=m_r3)

    # k k^T by blocks, from the raw keys; the l2 norms scale it afterwards
    k += t0 * stride_k_t + i_hk * stride_k_h
    DT = k.dtype.element_ty
    b_A00 = tl.zeros([BC, BC], dtype=tl.float32)
    b_A11, b_A22, b_A33 = tl.zeros_like(b_A00), tl.zeros_like(b_A00), tl.zeros_like(b_A00)
    b_A10, b_A20, b_A21 = tl.zeros_like(b_A00), tl.zeros_like(b_A00), tl.zeros_like(b_A00)
    b_A30, b_A31, b_A32 = tl.zeros_like(b_A00), tl.zeros_like(b_A00), tl.zeros_like(b_A00)
    b_ss0 = tl.zeros([BC], dtype=tl.float32)
    b_ss1, b_ss2, b_ss3 = tl.zeros_like(b_ss0), tl.zeros_like(b_ss0), tl.zeros_like(b_ss0)
    for i_k in range(0, K, BKS):
        m_s = i_k + o_s < K
        b_k0 = _load_rows(k + i_k, o_r0, m_r0, stride_k_t, o_s, m_s)
        b_k1 = _load_rows(k + i_k, o_r1, m_r1, stride_k_t, o_s, m_s)
        b_k2 = _load_rows(k + i_k, o_r2, m_r2, stride_k_t, o_s, m_s)
        b_k3 = _load_rows(k + i_k, o_r3, m_r3, stride_k_t, o_s, m_s)
        b_ss0 += tl.sum(b_k0.to(tl.float32) * b_k0.to(tl.float32), 1)
        b_ss1 += tl.sum(b_k1.to(tl.float32) * b_k1.to(tl.float32), 1)
        b_ss2 += tl.sum(b_k2.to(tl.float32) * b_k2.to(tl.float32), 1)
        b_ss3 += tl.sum(b_k3.to(tl.float32) * b_k3.to(tl.float32), 1)
        b_A00 += _dot(b_k0, tl.trans(b_k0), PREC)
        b_A11 += _dot(b_k1, tl.trans(b_k1), PREC)
        b_A22 += _dot(b_k2, tl.trans(b_k2), PREC)
        b_A33 += _dot(b_k3, tl.trans(b_k3), PREC)
        b_A10 += _dot(b_k1, tl.trans(b_k0), PREC)
        b_A20 += _dot(b_k2, tl.trans(b_k0), PREC)
        b_A21 += _dot(b_k2, tl.trans(b_k1), PREC)
        b_A30 += _dot(b_k3, tl.trans(b_k0), PREC)
        b_A31 += _dot(b_k3, tl.trans(b_k1), PREC)
        b_A32 += _dot(b_k3, tl.trans(b_k2), PREC)
    b_rk0, b_rk1 = tl.rsqrt(b_ss0 + 1e-6), tl.rsqrt(b_ss1 + 1e-6)  # l2norm's eps
    b_rk2, b_rk3 = tl.rsqrt(b_ss2 + 1e-6), tl.rsqrt(b_ss3 + 1e-6)

    # A = beta (k k^T) exp(gamma_r - gamma_c) on normalized keys, strictly lower
    b_A00 = _decay(b_A00 * b_rk0[:, None] * b_rk0[None, :], b_g0, b_g0, b_b0, True)
    b_A11 = _decay(b_A11 * b_rk1[:, None] * b_rk1[None, :], b_g1, b_g1, b_b1, True)
    b_A22 = _decay(b_A22 * b_rk2[:, None] * b_rk2[None, :], b_g2, b_g2, b_b2, True)
    b_A33 = _decay(b_A33 * b_rk3[:, None] * b_rk3[None, :], b_g3, b_g3, b_b3, True)
    b_A10 = _decay(b_A10 * b_rk1[:, None] * b_rk0[None, :], b_g1, b_g0, b_b1, False)
    b_A20 = _decay(b_A20 * b_rk2[:, None] * b_rk0[None, :], b_g2, b_g0, b_b2, False)
    b_A21 = _decay(b_A21 * b_rk2[:, None] * b_rk1[None, :], b_g2, b_g1, b_b2, False)
    b_A30 = _decay(b_A30 * b_rk3[:, None] * b_rk0[None, :], b_g3, b_g0, b_b3, False)
    b_A31 = _decay(b_A31 * b_rk3[:, None] * b_rk1[None, :], b_g3, b_g1, b_b3, False)
    b_A32 = _decay(b_A32 * b_rk3[:, None] * b_rk2[None, :], b_g3, b_g2, b_b3, False)

    # X = (I + A)^-1: diagonal blocks by substitution, then X_ij = -X_ii sum_k A_ik X_kj
    b_X00 = _unit_lower_inverse(b_A00)
    b_X11 = _unit_lower_inverse(b_A11)
    b_X22 = _unit_lower_inverse(b_A22)
    b_X33 = _unit_lower_inverse(b_A33)
    b_X10 = -_dot(b_X11, _dot(b_A10, b_X00, PREC), PREC)
    b_X21 = -_dot(b_X22, _dot(b_A21, b_X11, PREC), PREC)
    b_X32 = -_dot(b_X33, _dot(b_A32, b_X22, PREC), PREC)
    b_X20 = -_dot(b_X22, _dot(b_A20, b_X00, PREC) + _dot(b_A21, b_X10, PREC), PREC)
    b_X31 = -_dot(b_X33, _dot(b_A31, b_X11, PREC) + _dot(b_A32, b_X21, PREC), PREC)
    b_X30 = -_dot(b_X33, _dot(b_A30, b_X00, PREC) + _dot(b_A31, b_X10, PREC) + _dot(b_A32, b_X20, PREC), PREC)
    b_X00, b_X11, b_X22, b_X33 = b_X00.to(DT), b_X11.to(DT), b_X22.to(DT), b_X33.to(DT)
    b_X10, b_X21, b_X32 = b_X10.to(DT), b_X21.to(DT), b_X32.to(DT)
    b_X20, b_X31, b_X30 = b_X20.to(DT), b_X31.to(DT), b_X30.to(DT)

    # W = X (beta exp(gamma) K); the first value head of each key head also stores the normalized keys
    b_s0, b_s1 = b_rk0 * b_b0 * tl.exp(b_g0), b_rk1 * b_b1 * tl.exp(b_g1)
    b_s2, b_s3 = b_rk2 * b_b2 * tl.exp(b_g2), b_rk3 * b_b3 * tl.exp(b_g3)
    w += (t0 * HV + i_h) * K
    kn += (t0 * HK + i_hk) * K
    STORE_KN = i_h % (HV // HK) == 0
    for i_k in range(0, K, BKS):
        m_s = i_k + o_s < K
        b_k0 = _load_rows(k + i_k, o_r0, m_r0, stride_k_t, o_s, m_s)
        b_k1 = _load_rows(k + i_k, o_r1, m_r1, stride_k_t, o_s, m_s)
        b_k2 = _load_rows(k + i_k, o_r2, m_r2, stride_k_t, o_s, m_s)
        b_k3 = _load_rows(k + i_k, o_r3, m_r3, stride_k_t, o_s, m_s)
        if STORE_KN:
            _store_rows(kn + i_k, o_r0, m_r0, HK * K, o_s, m_s, b_k0.to(tl.float32) * b_rk0[:, None])
            _store_rows(kn + i_k, o_r1, m_r1, HK * K, o_s, m_s, b_k1.to(tl.float32) * b_rk1[:, None])
            _store_rows(kn + i_k, o_r2, m_r2, HK * K, o_s, m_s, b_k2.to(tl.float32) * b_rk2[:, None])
            _store_rows(kn + i_k, o_r3, m_r3, HK * K, o_s, m_s, b_k3.to(tl.float32) * b_rk3[:, None])
        _store_block_product(w + i_k, o_r0, o_r1, o_r2, o_r3, m_r0, m_r1, m_r2, m_r3, HV * K, o_s, m_s,
                             b_X00, b_X10, b_X11, b_X20, b_X21, b_X22, b_X30, b_X31, b_X32, b_X33,
                             _scale_rows(b_k0, b_s0, DT), _scale_rows(b_k1, b_s1, DT),
                             _scale_rows(b_k2, b_s2, DT), _scale_rows(b_k3, b_s3, DT), PREC)

    # U = X (beta V)
    v += t0 * stride_v_t + i_h * stride_v_h
    u += (t0 * HV + i_h) * V
    for i_v in range(0, V, BKS):
        m_s = i_v + o_s < V
        b_v0 = _scale_rows(_load_rows(v + i_v, o_r0, m_r0, stride_v_t, o_s, m_s), b_b0, DT)
        b_v1 = _scale_rows(_load_rows(v + i_v, o_r1, m_r1, stride_v_t, o_s, m_s), b_b1, DT)
        b_v2 = _scale_rows(_load_rows(v + i_v, o_r2, m_r2, stride_v_t, o_s, m_s), b_b2, DT)
        b_v3 = _scale_rows(_load_rows(v + i_v, o_r3, m_r3, stride_v_t, o_s, m_s), b_b3, DT)
        _store_block_product(u + i_v, o_r0, o_r1, o_r2, o_r3, m_r0, m_r1, m_r2, m_r3, HV * V, o_s, m_s,
                             b_X00, b_X10, b_X11, b_X20, b_X21, b_X22, b_X30, b_X31, b_X32, b_X33,
                             b_v0, b_v1, b_v2, b_v3, PREC)


@triton.jit(do_not_specialize=["N"])
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
    stride_s,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BT: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    PREC: tl.constexpr,
):
    """One program per (V block, value head, sequence), looping over the sequence's chunks with
    the state in registers (fp32) as one or two [BK, BV] row blocks (K <= 2 * BK), as fla does."""
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
        b_v = (b_v * tl.where(m_c, tl.exp(b_g_last - b_g), 0.0)[:, None]).to(DT)
        b_decay = tl.exp(b_g_last)
        p_k = kn + t0 * HK * K + o_c[None, :] * (HK * K)  # keys transposed: [BK, BT]
        b_k = tl.load(p_k + o_k1[:, None], mask=m_k1[:, None] & m_c[None, :], other=0.0)
        b_h1 = b_h1 * b_decay + _dot(b_k, b_v, PREC)
        if K > BK:
            b_k = tl.load(p_k + o_k2[:, None], mask=m_k2[:, None] & m_c[None, :], other=0.0)
            b_h2 = b_h2 * b_decay + _dot(b_k, b_v, PREC)

    tl.store(p_s + o_h, b_h1.to(ssm_states.dtype.element_ty), mask=m_h1)
    if K > BK:
        tl.store(p_s + BK * V + o_h, b_h2.to(ssm_states.dtype.element_ty), mask=m_h2)


@triton.autotune(configs=_configs(num_warps=[4, 8], num_stages=[1], BV=[64, 128]), key=["HK", "HV", "K", "V"],
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
    """One program per (virtual chunk, value head, V block)."""
    i_c, i_h, i_v = tl.program_id(0), tl.program_id(1), tl.program_id(2)
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
