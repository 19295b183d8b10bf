"""The ends of a MoE layer's expert GEMMs, shared by the tensor-core kernels (fused_moe.py) and the
few-token GEMVs (moe_gemv.py): the experts' activation after the up GEMM; after the down GEMM, the
combine of the weighted slot sum with the shared expert, and the last-arriver sum of a token's slots
that lets a down kernel finish the layer without a combine launch."""

import triton
import triton.language as tl


@triton.jit
def expert_activation(acc, acc_up, GATED: tl.constexpr):
    """silu(gate) * up from float32 gate sums acc and up sums acc_up, or relu(acc)**2 (acc_up unused)."""
    if GATED:
        b_h = acc * tl.sigmoid(acc) * acc_up
    else:
        b_h = tl.maximum(acc, 0.0)
        b_h = b_h * b_h
    return b_h


@triton.jit
def finish_combine(acc, shared, shared_gate, t, o_h, m_h, stride_shared, stride_gate, dtype: tl.constexpr,
                   HAS_SHARED: tl.constexpr, HAS_GATE: tl.constexpr):
    """The experts' float32 sum acc [BLOCK] of token t's columns o_h (+ sigmoid(shared_gate[t]) *
    shared[t]), rounded to dtype where the eager model rounds: the sum, the gate, the gated shared
    output, the total. Kernels calling it compile with enable_fp_fusion=False (fused_moe.py:
    _combine_kernel says why)."""
    if HAS_SHARED:
        acc = acc.to(dtype).to(tl.float32)
        b_s = tl.load(shared + t * stride_shared + o_h, mask=m_h, other=0.0).to(tl.float32)
        if HAS_GATE:
            b_g = tl.load(shared_gate + t * stride_gate).to(dtype).to(tl.float32)
            b_s = (tl.sigmoid(b_g).to(dtype).to(tl.float32) * b_s).to(dtype).to(tl.float32)
        acc += b_s
    return acc.to(dtype)


@triton.jit
def sum_slots_if_last(rows, stride_rows, arrivals, counter, t, o_n, m_n, out, stride_out, shared, shared_gate,
                      stride_shared, stride_gate, TOPK: tl.constexpr, HAS_SHARED: tl.constexpr,
                      HAS_GATE: tl.constexpr):
    """Called by a down program once it has stored its slot's float32 columns o_n (m_n: in range) of token t
    in rows: counts itself in arrivals[counter]. The last of the token's TOPK programs for these columns
    adds rows t * TOPK + j in slot order, finishes them (finish_combine) into out[t, o_n] and sets the count
    back to 0 (triton_kernels/arrival_counters.py), so the sum is deterministic without float atomics."""
    tl.debug_barrier()  # every thread's columns are written before the count says so
    if tl.atomic_add(arrivals + counter, 1, sem="acq_rel") == TOPK - 1:  # the token's other slots are in
        b_sum = tl.zeros(o_n.shape, dtype=tl.float32)
        for j in tl.static_range(TOPK):
            b_sum += tl.load(rows + (t * TOPK + j).to(tl.int64) * stride_rows + o_n, mask=m_n, other=0.0,
                             cache_modifier=".cg")
        b_out = finish_combine(b_sum, shared, shared_gate, t, o_n, m_n, stride_shared, stride_gate,
                               out.dtype.element_ty, HAS_SHARED, HAS_GATE)
        tl.store(out + t.to(tl.int64) * stride_out + o_n, b_out, mask=m_n)
        tl.atomic_xchg(arrivals + counter, 0)
