"""The two element-wise ends of a MoE layer's expert GEMMs, shared by the tensor-core kernels
(fused_moe.py) and the few-token GEMVs (moe_gemv.py): the experts' activation after the up GEMM, and
the combine of the weighted slot sum with the shared expert after the down GEMM."""

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
