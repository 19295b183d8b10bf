"""The three kernels of the Mamba2 chunked scan (the math is in ssd_chunk.py).

1. dt     (chunk, head block; parallel): dt = clamp(softplus(dt + dt_bias)) and its decay
          cumsum dA_cum = cumsum(dt * A) within the chunk, stored head-major [H, T] (fp32)
2. state  (P block, head, sequence; sequential over the chunks): the [P, N] state in registers
          (fp32) from the pool slot (or zeros); stores the state entering each chunk, then
          S <- exp(dA_last) S + (x * exp(dA_last - dA_cum) dt)^T B; writes the final state back,
          and the state after each requested cut (snapshot) to that cut's pool slot
3. output (chunk, group, block of heads; parallel): CB = C B^T once per group, then per head
          y = exp(dA_cum) (C S^T) + (CB * exp(dA_cum_t - dA_cum_s) dt_s * [s <= t]) x + D x,
          times silu(z) when z is given

Chunks are addressed by virtual index (triton_kernels/varlen.py). Inputs x [T, H, P], dt [T, H],
B, C [T, G, N] and z [T, H, P] are strided views with a unit last stride. Scratch: dt and dA_cum
[H, T] fp32; h [num_virtual_chunks, H, P, N] (the state entering each chunk) in the input dtype,
the operand dtype of the matmuls. Tile offsets are int32 from scalar int64 bases (chunk or
sequence start). PREC is "tf32x3" for float32 inputs (close to float32 on tensor cores), else
"tf32" (unused: bf16 and fp16 operands take their own MMA).
"""

import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.varlen import locate_chunk


@triton.jit
def _rows(p, o_r, m_r, stride_r, o_c, m_c):
    """[len(o_r), len(o_c)] block of a row-major view with row stride stride_r and unit column stride."""
    return tl.load(p + o_r[:, None] * stride_r + o_c[None, :], mask=m_r[:, None] & m_c[None, :], other=0.0)


@triton.jit
def _rows_transposed(p, o_r, m_r, stride_r, o_c, m_c):
    """The same block read as [len(o_c), len(o_r)]."""
    return tl.load(p + o_r[None, :] * stride_r + o_c[:, None], mask=m_r[None, :] & m_c[:, None], other=0.0)


@triton.jit
def softplus_clamp(b_x, lo, hi):
    """clamp(softplus(x), lo, hi) in float32, with torch's softplus threshold (x itself above 20)."""
    b_x = b_x.to(tl.float32)
    b_sp = tl.where(b_x <= 20.0, tl.log(1.0 + tl.exp(tl.minimum(b_x, 20.0))), b_x)
    return tl.minimum(tl.maximum(b_sp, lo), hi)


@cached_launch
@triton.jit(do_not_specialize=["T", "num_seqs"])
def _ssd_dt_kernel(
    dt,
    A_log,
    dt_bias,
    dt_out,
    dA_cum,
    cu_seqlens,
    stride_dt_t,
    dt_lo,
    dt_hi,
    T,
    num_seqs,
    H: tl.constexpr,
    BT: tl.constexpr,
    BH: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """One program per (virtual chunk, block of BH heads): [BT, BH] tiles of dt, cumsum down the tokens."""
    i_c, i_hb = tl.program_id(0), tl.program_id(1)
    i_n, i_t, bos, eos = locate_chunk(cu_seqlens, i_c, num_seqs, BT, BLOCK_N)
    if i_t * BT >= eos - bos:
        return
    t0 = bos + i_t * BT
    o_t = tl.arange(0, BT)
    o_h = i_hb * BH + tl.arange(0, BH)
    m_t, m_h = o_t < eos - t0, o_h < H
    m = m_t[:, None] & m_h[None, :]
    b_bias = tl.load(dt_bias + o_h, mask=m_h, other=0.0).to(tl.float32)
    b_A = -tl.exp(tl.load(A_log + o_h, mask=m_h, other=0.0).to(tl.float32))
    b_dt = _rows(dt + t0 * stride_dt_t, o_t, m_t, stride_dt_t, o_h, m_h).to(tl.float32) + b_bias[None, :]
    b_dt = tl.where(m, softplus_clamp(b_dt, dt_lo, dt_hi), 0.0)  # [BT, BH]; zero past the sequence
    b_cum = tl.cumsum(b_dt * b_A[None, :], 0)
    o_out = o_h[None, :].to(tl.int64) * T + o_t[:, None]  # head-major [H, T]
    tl.store(dt_out + t0 + o_out, b_dt, mask=m)
    tl.store(dA_cum + t0 + o_out, b_cum, mask=m)


@triton.jit
def _segment_update(b_s, x, B, stride_x_t, stride_B_t, o_t, m_t, m_seg, o_p, m_p, o_n, m_n, b_w, b_decay, DT, PREC):
    """The [BP, BN] state after the chunk's tokens in m_seg: exp(b_decay) S + (x * w)^T B, with x and
    B the chunk's tokens (m_t) from its first one, w [BT] each token's decay to the segment's end
    times its dt, zero outside the segment."""
    b_xw = (_rows_transposed(x, o_t, m_t, stride_x_t, o_p, m_p).to(tl.float32)
            * tl.where(m_seg, b_w, 0.0)[None, :]).to(DT)  # [BP, BT]
    b_B = _rows(B, o_t, m_t, stride_B_t, o_n, m_n).to(DT)  # [BT, BN]
    return tl.dot(b_xw, b_B, b_s * tl.exp(b_decay), input_precision=PREC)


@cached_launch
@triton.jit(do_not_specialize=["T", "num_cuts"])
def _ssd_chunk_state_kernel(
    x,
    B,
    dt,
    dA_cum,
    h,
    ssm_states,
    cu_seqlens,
    state_slots,
    has_initial_state,
    snap_pos,
    snap_slots,
    stride_x_t,
    stride_x_h,
    stride_B_t,
    stride_B_g,
    stride_s,
    T,
    num_cuts,
    H: tl.constexpr,
    G: tl.constexpr,
    P: tl.constexpr,
    N: tl.constexpr,
    BT: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
    BC: tl.constexpr,
    BS: tl.constexpr,
    HAS_SNAP: tl.constexpr,
    PREC: tl.constexpr,
):
    """One program per (P block, head, sequence), looping over the sequence's chunks with the
    [BP, N] state slice in registers (fp32): per chunk one MMA, with the decayed state as its
    accumulator, while the next chunk's x and B are prefetched.

    With HAS_SNAP, row i_n of snap_pos / snap_slots ([num_seqs, num_cuts] int32, distinct cuts p,
    -1 for none; BC >= num_cuts) asks for the state after the first p tokens in pool slot
    snap_slots. With cuts the chunks are updated in windows of BS tokens (BS divides BT: the same
    arithmetic in smaller MMAs), so that a cut at a window's end (the prefix cache's fixed cuts are
    multiples of 64) stores the updated state; a cut strictly inside a window splits the window's
    update in two MMAs: the first is the update as if the sequence ended at p (tokens >= p masked,
    decay from dA_cum[p - 1]), stored, the second continues from it. Where no cut falls, the
    snapshot store is predicated off."""
    i_p, i_h, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    length = tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos
    slot = tl.load(state_slots + i_n).to(tl.int64)
    i_g = i_h // (H // G)
    o_t = tl.arange(0, BT)
    o_p = i_p * BP + tl.arange(0, BP)
    o_n = tl.arange(0, BN)
    m_p, m_n = o_p < P, o_n < N
    o_s = o_p[:, None] * N + o_n[None, :]  # [BP, BN] in a [P, N] state
    m_s = m_p[:, None] & m_n[None, :]

    # the flag enters as a bound: the interpreter cannot broadcast a scalar bool into a mask
    p_init = P * (tl.load(has_initial_state + i_n) != 0).to(tl.int32)
    p_s = ssm_states + slot * stride_s + i_h * P * N
    b_s = tl.load(p_s + o_s, mask=(o_p < p_init)[:, None] & m_n[None, :], other=0.0).to(tl.float32)

    x += bos * stride_x_t + i_h * stride_x_h
    B += bos * stride_B_t + i_g * stride_B_g
    dt += i_h.to(tl.int64) * T + bos
    dA_cum += i_h.to(tl.int64) * T + bos
    h += ((bos // BT + i_n) * H + i_h) * P * N  # the state entering the sequence's first chunk
    DT = h.dtype.element_ty
    if HAS_SNAP:
        # one flat loop over segments [lo, hi): the windows, split where a cut falls inside one (a loop
        # nested in the chunk loop makes the compiler spill the state at P block 64, N 128). The cuts
        # stay in registers: a load in the loop would put its latency on every step's path.
        o_c = tl.arange(0, BC)
        m_c = o_c < num_cuts
        o_w = tl.arange(0, BS)
        b_pos = tl.load(snap_pos + i_n * num_cuts + o_c, mask=m_c, other=-1)
        b_slot = tl.load(snap_slots + i_n * num_cuts + o_c, mask=m_c, other=0).to(tl.int64)
        num_inside = tl.sum(((b_pos > 0) & (b_pos < length) & (b_pos % BS != 0)).to(tl.int32), 0)
        lo = bos * 0  # int64
        b_lo = 0.0  # dA_cum at token lo - 1, 0 at a chunk's start (the cumsum restarts per chunk)
        for _ in range(tl.cdiv(length, BS) + num_inside):
            t0 = lo // BT * BT
            t1 = tl.minimum(t0 + BT, length)
            s0 = lo // BS * BS  # the window holding lo
            s1 = tl.minimum(s0 + BS, length)
            hi = tl.min(tl.where((b_pos > lo) & (b_pos < s1), b_pos, s1), 0)  # the first cut after lo, or s1
            # stores predicated by a bound rather than branched on: a branch also makes it spill
            p_h = P * (lo == t0).to(tl.int32)
            tl.store(h + lo // BT * H * P * N + o_s, b_s.to(DT), mask=(o_p < p_h)[:, None] & m_n[None, :])
            m_w = o_w < length - s0
            b_cum = tl.load(dA_cum + s0 + o_w, mask=m_w, other=0.0)
            b_hi = tl.load(dA_cum + hi - 1)
            b_s = _segment_update(b_s, x + s0 * stride_x_t, B + s0 * stride_B_t, stride_x_t, stride_B_t, o_w, m_w,
                                  (o_w >= lo - s0) & (o_w < hi - s0), o_p, m_p, o_n, m_n,
                                  tl.exp(b_hi - b_cum) * tl.load(dt + s0 + o_w, mask=m_w, other=0.0), b_hi - b_lo,
                                  DT, PREC)
            at_cut = b_pos == hi  # [BC], at most one set
            p_c = ssm_states + tl.sum(tl.where(at_cut, b_slot, 0), 0) * stride_s + i_h * P * N
            p_c_bound = P * tl.sum(at_cut.to(tl.int32), 0)
            tl.store(p_c + o_s, b_s.to(ssm_states.dtype.element_ty), mask=(o_p < p_c_bound)[:, None] & m_n[None, :])
            b_lo = tl.where(hi == t1, 0.0, b_hi)
            lo = hi
    else:
        for i_t in range(tl.cdiv(length, BT)):
            t0 = i_t * BT  # int64, like the trip count
            m_t = o_t < length - t0
            tl.store(h + i_t * H * P * N + o_s, b_s.to(DT), mask=m_s)
            b_cum = tl.load(dA_cum + t0 + o_t, mask=m_t, other=0.0)
            b_last = tl.load(dA_cum + tl.minimum(t0 + BT, length) - 1)
            b_w = tl.where(m_t, tl.exp(b_last - b_cum) * tl.load(dt + t0 + o_t, mask=m_t, other=0.0), 0.0)
            b_xw = (_rows_transposed(x + t0 * stride_x_t, o_t, m_t, stride_x_t, o_p, m_p).to(tl.float32)
                    * b_w[None, :]).to(DT)  # [BP, BT]
            b_B = _rows(B + t0 * stride_B_t, o_t, m_t, stride_B_t, o_n, m_n).to(DT)  # [BT, BN]
            b_s = tl.dot(b_xw, b_B, b_s * tl.exp(b_last), input_precision=PREC)

    tl.store(p_s + o_s, b_s.to(ssm_states.dtype.element_ty), mask=m_s)


@cached_launch
@triton.jit(do_not_specialize=["T", "num_seqs"])
def _ssd_chunk_output_kernel(
    x,
    B,
    C,
    z,
    D,
    dt,
    dA_cum,
    h,
    y,
    cu_seqlens,
    stride_x_t,
    stride_x_h,
    stride_B_t,
    stride_B_g,
    stride_C_t,
    stride_C_g,
    stride_z_t,
    stride_z_h,
    T,
    num_seqs,
    H: tl.constexpr,
    G: tl.constexpr,
    P: tl.constexpr,
    N: tl.constexpr,
    BT: tl.constexpr,
    BP: tl.constexpr,
    BN: tl.constexpr,
    HEADS: tl.constexpr,
    HAS_Z: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PREC: tl.constexpr,
):
    """One program per (virtual chunk, group, block of HEADS heads of that group), head blocks then
    groups fastest: the programs of one chunk run together and share its B, C and x through the
    cache. CB = C B^T is computed once and kept in registers for the program's heads; each head's
    [BT, BT] mixing matrix is built once and applied to its head dim in blocks of BP."""
    NHB: tl.constexpr = H // G // HEADS
    pid = tl.program_id(0)
    i_hb, i_g, i_c = pid % NHB, pid // NHB % G, pid // (NHB * G)
    i_n, i_t, bos, eos = locate_chunk(cu_seqlens, i_c, num_seqs, BT, BLOCK_N)
    if i_t * BT >= eos - bos:
        return
    t0 = bos + i_t * BT
    o_t = tl.arange(0, BT)
    o_n = tl.arange(0, BN)
    m_t, m_n = o_t < eos - t0, o_n < N
    m_causal = o_t[:, None] >= o_t[None, :]

    b_C = _rows(C + t0 * stride_C_t + i_g * stride_C_g, o_t, m_t, stride_C_t, o_n, m_n)  # [BT, BN]
    DT = b_C.dtype
    b_B = _rows(B + t0 * stride_B_t + i_g * stride_B_g, o_t, m_t, stride_B_t, o_n, m_n)
    b_CB = tl.dot(b_C, tl.trans(b_B), input_precision=PREC)  # [BT, BT] fp32

    h0 = (i_g * (H // G) + i_hb * HEADS).to(tl.int64)
    x += t0 * stride_x_t + h0 * stride_x_h
    z += t0 * stride_z_t + h0 * stride_z_h
    y += (t0 * H + h0) * P
    dt += h0 * T + t0
    dA_cum += h0 * T + t0
    h += (i_c.to(tl.int64) * H + h0) * (P * N)
    for j in range(HEADS):
        b_cum = tl.load(dA_cum + j * T + o_t, mask=m_t, other=0.0)
        b_dt = tl.load(dt + j * T + o_t, mask=m_t, other=0.0)
        b_D = tl.load(D + h0 + j).to(tl.float32)
        # the chunk's part mixes tokens s <= t; dA_cum does not grow along the chunk, the clamp only
        # guards the masked entries
        b_decay = tl.exp(tl.minimum(b_cum[:, None] - b_cum[None, :], 0.0))
        b_M = tl.where(m_causal, b_CB * b_decay * b_dt[None, :], 0.0).to(DT)
        for i_p in range(0, P, BP):
            o_p = i_p + tl.arange(0, BP)
            m_p = o_p < P
            # the state's part: the state entering the chunk, decayed to each token
            b_h = _rows_transposed(h + j * (P * N), o_p, m_p, N, o_n, m_n)  # [BN, BP]
            b_y = tl.dot(b_C, b_h, input_precision=PREC) * tl.exp(b_cum)[:, None]  # [BT, BP]
            b_x = _rows(x + j * stride_x_h, o_t, m_t, stride_x_t, o_p, m_p)
            b_y = tl.dot(b_M, b_x, b_y, input_precision=PREC)
            b_y += b_D * b_x.to(tl.float32)
            if HAS_Z:
                b_z = _rows(z + j * stride_z_h, o_t, m_t, stride_z_t, o_p, m_p).to(tl.float32)
                b_y *= b_z * tl.sigmoid(b_z)
            tl.store(y + j * P + o_t[:, None] * (H * P) + o_p[None, :], b_y.to(y.dtype.element_ty),
                     mask=m_t[:, None] & m_p[None, :])
