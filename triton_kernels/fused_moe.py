"""Mixture-of-experts feed-forward over routed tokens: out[t] = sum_k w[t, k] * y_{e(t, k)}(x[t]),
plus an optional shared expert's output, scaled by sigmoid of its gate logit when it has one:
out[t] += sigmoid(shared_gate[t]) * shared[t].

activation "silu": gated experts, y_e(x) = down_e(silu(gate_e x) * up_e x), w13 [E, 2I, H];
activation "relu2": non-gated experts (Nemotron-H), y_e(x) = down_e(relu(up_e x)^2), w13 [E, I, H].

FP8 experts (w13_scale / w2_scale given): w13 and w2 are float8_e4m3fn with one float32 scale per
128 x 128 block of each expert's matrix, [E, ceil(rows/128), ceil(cols/128)] (fp8_quant.py); only the
weights are quantized. The kernels widen each e4m3 tile to x's dtype and scale its partial sum per
output column, so K tiles must not straddle a 128 block."""

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from triton_kernels.arrival_counters import arrival_counters, parts_scratch
from triton_kernels.cached_launch import cached_launch
from triton_kernels.fastest import fastest
from triton_kernels.fp8_quant import FP8_BLOCK, FP8_DTYPE, dequantize_fp8
from triton_kernels.host_math import cdiv, next_power_of_2
from triton_kernels.moe_epilogue import expert_activation, finish_combine, sum_slots_if_last
from triton_kernels.moe_gemv import expert_gemvs
from triton_kernels.moe_sort import bins_for, locate_block, max_blocks, sort_by_expert


def fused_moe_ref(
    *,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    shared: torch.Tensor | None = None,
    shared_gate: torch.Tensor | None = None,
    partial: bool = False,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """x: [T, H]; w13: [E, 2I, H] (gate rows then up rows) or [E, I, H] for relu2; w2: [E, H, I];
    topk_weights: [T, k] float32; topk_ids: [T, k]; shared: [T, H] or None; shared_gate: [T] logits
    or None. Returns [T, H] in x's dtype. partial: some ids are E, experts held elsewhere (expert
    parallelism); those slots add nothing. w13_scale, w2_scale: FP8 experts' block scales (each
    expert's weights are dequantized, then used in x's dtype)."""
    def weight(w: torch.Tensor, scale: torch.Tensor | None, expert: int) -> torch.Tensor:
        return w[expert] if scale is None else dequantize_fp8(w[expert], scale[expert]).to(x.dtype)

    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.flatten()
    for expert in flat_ids.unique().tolist():
        if partial and expert == w2.shape[0]:
            continue
        token, which = (topk_ids == expert).nonzero(as_tuple=True)
        h = F.linear(x[token], weight(w13, w13_scale, expert))
        if activation == "silu":
            gate, up = h.chunk(2, dim=-1)
            h = F.silu(gate) * up
        elif activation == "relu2":
            h = F.relu(h).square()
        else:
            raise ValueError(f"unsupported MoE activation {activation!r}; expected 'silu' or 'relu2'")
        y = F.linear(h, weight(w2, w2_scale, expert))
        out.index_add_(0, token, y.float() * topk_weights[token, which, None])
    out = out.to(x.dtype)
    if shared is not None:  # in the model dtype, rounded where the eager model rounds
        gate = 1.0 if shared_gate is None else torch.sigmoid(shared_gate.to(x.dtype))[:, None]
        out = out + gate * shared
    return out


# ---------------------------------------------------------------------------------------------
# Fused path. The T*k (token, slot) assignments a = t * k + j are sorted by expert on the device
# (moe_sort.py), so the rows of each expert are contiguous. The two grouped GEMMs walk BLOCK_M-row
# blocks of those rows; every program finds its block's expert from expert_offsets, so the grids have
# a fixed worst-case size (no host sync, CUDA-graph safe) and programs past the last block return at
# once. Up to UNSORTED_MAX_ROWS assignments (decode at small
# batch) skip the sort: each assignment is a row block of its own, its expert read from topk_ids; so
# few rows rarely share an expert, and the sort kernel's launch is the larger cost.
#   up:   inter[p] = act(x[t(p)] @ w13[e]^T)          [T*k, I] in x's dtype, p a sorted position
#   down: rows[a]  = w[a] * (inter[p(a)] @ w2[e]^T)    [T*k, H] in x's dtype, in assignment order
#   out = rows.view(T, k, H).sum(1)                     the combine kernel, in slot order
# Unsorted, the down kernel sums the slots itself: rows are float32 scratch and the last of a token's
# slots to finish a column block adds them in slot order (a counter per token and block, no float
# atomics), so decode runs two launches. Both orders are fixed: results are deterministic.


@triton.jit
def _fp8_weight_dot(b_x, b_w, b_s, PREC: tl.constexpr):
    """b_x [BLOCK_M, BLOCK_K] activations, b_w [BLOCK_K, BLOCK_N] e4m3 within one scale block, b_s [BLOCK_N]
    its scales -> b_x @ (b_w * b_s) [BLOCK_M, BLOCK_N] float32, the weight widened to x's dtype."""
    return tl.dot(b_x, b_w.to(b_x.dtype), input_precision=PREC) * b_s[None, :]


@cached_launch
@triton.jit
def _moe_up_kernel(x, w13, s13, inter, sorted_assign, expert_offsets, stride_x, stride_we, stride_wn, stride_se,
                   stride_sn, stride_inter, H, I, E, TOPK: tl.constexpr, GATED: tl.constexpr, PREC: tl.constexpr,
                   NUM_BINS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   EVEN_K: tl.constexpr, UNSORTED: tl.constexpr, FP8_W: tl.constexpr):
    """One program per (row block, BLOCK_N columns of I): gathers x rows by token, multiplies by the
    expert's w13 rows (gate rows o_n and up rows I + o_n when GATED), applies the activation.
    UNSORTED: block i is assignment i alone (sorted_assign holds topk_ids), its row of inter is i.
    FP8_W: w13 is e4m3 and s13 [E, rows / 128, H / 128] its block scales."""
    num_n = tl.cdiv(I, BLOCK_N)
    i_b, i_n = tl.program_id(0) // num_n, tl.program_id(0) % num_n
    if UNSORTED:
        i_e, row, row_end = tl.load(sorted_assign + i_b), i_b, i_b + 1
    else:
        i_e, row, row_end = locate_block(expert_offsets, i_b, E, BLOCK_M, NUM_BINS)
    if i_e >= E:
        return
    o_m = row + tl.arange(0, BLOCK_M)
    m_m = o_m < row_end
    if UNSORTED:
        b_token = (o_m // TOPK).to(tl.int64)
    else:
        b_token = (tl.load(sorted_assign + o_m, mask=m_m, other=0) // TOPK).to(tl.int64)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < I
    o_k = tl.arange(0, BLOCK_K)
    p_x = x + b_token[:, None] * stride_x + o_k[None, :]  # [BLOCK_M, BLOCK_K]
    p_w = w13 + i_e.to(tl.int64) * stride_we + o_n[None, :] * stride_wn + o_k[:, None]  # [BLOCK_K, BLOCK_N]
    p_s = s13 + i_e.to(tl.int64) * stride_se + (o_n // 128) * stride_sn  # [BLOCK_N] (FP8_W)
    p_su = s13 + i_e.to(tl.int64) * stride_se + ((I + o_n) // 128) * stride_sn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.cdiv(H, BLOCK_K)):
        m_k = o_k < H - k * BLOCK_K
        if EVEN_K:
            b_x = tl.load(p_x, mask=m_m[:, None], other=0.0)
            b_w = tl.load(p_w, mask=m_n[None, :], other=0.0)
        else:
            b_x = tl.load(p_x, mask=m_m[:, None] & m_k[None, :], other=0.0)
            b_w = tl.load(p_w, mask=m_k[:, None] & m_n[None, :], other=0.0)
        if FP8_W:
            b_s = tl.load(p_s + (k * BLOCK_K) // 128, mask=m_n, other=0.0)
            acc += _fp8_weight_dot(b_x, b_w, b_s, PREC)
        else:
            acc = tl.dot(b_x, b_w, acc, input_precision=PREC)
        if GATED:
            if EVEN_K:
                b_u = tl.load(p_w + I * stride_wn, mask=m_n[None, :], other=0.0)
            else:
                b_u = tl.load(p_w + I * stride_wn, mask=m_k[:, None] & m_n[None, :], other=0.0)
            if FP8_W:
                b_su = tl.load(p_su + (k * BLOCK_K) // 128, mask=m_n, other=0.0)
                acc_up += _fp8_weight_dot(b_x, b_u, b_su, PREC)
            else:
                acc_up = tl.dot(b_x, b_u, acc_up, input_precision=PREC)
        p_x += BLOCK_K
        p_w += BLOCK_K
    b_h = expert_activation(acc, acc_up, GATED)
    p_o = inter + o_m.to(tl.int64)[:, None] * stride_inter + o_n[None, :]
    tl.store(p_o, b_h.to(inter.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


@cached_launch
@triton.jit
def _moe_down_kernel(inter, w2, s2, rows, sorted_assign, expert_offsets, topk_weights, out, shared, shared_gate,
                     arrivals, stride_inter, stride_we, stride_wh, stride_se, stride_sh, stride_rows, stride_out,
                     stride_shared, stride_gate, H, I, E, TOPK: tl.constexpr, PREC: tl.constexpr,
                     NUM_BINS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     EVEN_K: tl.constexpr, UNSORTED: tl.constexpr, FP8_W: tl.constexpr, SUM_SLOTS: tl.constexpr,
                     HAS_SHARED: tl.constexpr, HAS_GATE: tl.constexpr):
    """One program per (row block, BLOCK_N columns of H): inter rows @ w2[e]^T times the routing
    weight, stored at the rows' assignment indices. UNSORTED, FP8_W: as in _moe_up_kernel.

    SUM_SLOTS (UNSORTED only): rows is float32 scratch, and the token's TOPK slots are summed here
    instead of by _combine_kernel. Each program writes its row's columns, then counts itself in
    arrivals[t * num_n + i_n]; the last of the token's slots to arrive adds the TOPK rows in slot
    order, finishes as the combine does into out, and sets the count back to 0. Slots routed elsewhere
    (expert E) count too, with zero rows."""
    num_n = tl.cdiv(H, BLOCK_N)
    i_b, i_n = tl.program_id(0) // num_n, tl.program_id(0) % num_n
    if UNSORTED:
        i_e, row, row_end = tl.load(sorted_assign + i_b), i_b, i_b + 1
    else:
        i_e, row, row_end = locate_block(expert_offsets, i_b, E, BLOCK_M, NUM_BINS)
    if i_e >= E and not SUM_SLOTS:
        return
    o_m = row + tl.arange(0, BLOCK_M)
    m_m = o_m < row_end
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < H
    o_k = tl.arange(0, BLOCK_K)
    p_a = inter + o_m.to(tl.int64)[:, None] * stride_inter + o_k[None, :]  # [BLOCK_M, BLOCK_K]
    p_w = w2 + i_e.to(tl.int64) * stride_we + o_n[None, :] * stride_wh + o_k[:, None]  # [BLOCK_K, BLOCK_N]
    p_s = s2 + i_e.to(tl.int64) * stride_se + (o_n // 128) * stride_sh  # [BLOCK_N] (FP8_W)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, tl.where(i_e < E, tl.cdiv(I, BLOCK_K), 0)):
        if EVEN_K:
            b_a = tl.load(p_a, mask=m_m[:, None], other=0.0)
            b_w = tl.load(p_w, mask=m_n[None, :], other=0.0)
        else:
            m_k = o_k < I - k * BLOCK_K
            b_a = tl.load(p_a, mask=m_m[:, None] & m_k[None, :], other=0.0)
            b_w = tl.load(p_w, mask=m_k[:, None] & m_n[None, :], other=0.0)
        if FP8_W:
            b_s = tl.load(p_s + (k * BLOCK_K) // 128, mask=m_n, other=0.0)
            acc += _fp8_weight_dot(b_a, b_w, b_s, PREC)
        else:
            acc = tl.dot(b_a, b_w, acc, input_precision=PREC)
        p_a += BLOCK_K
        p_w += BLOCK_K
    if UNSORTED:
        b_assign = o_m
    else:
        b_assign = tl.load(sorted_assign + o_m, mask=m_m, other=0)
    acc *= tl.load(topk_weights + b_assign, mask=m_m, other=0.0)[:, None]
    p_o = rows + b_assign.to(tl.int64)[:, None] * stride_rows + o_n[None, :]
    tl.store(p_o, acc.to(rows.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])
    if SUM_SLOTS:
        t = i_b // TOPK
        sum_slots_if_last(rows, stride_rows, arrivals, t * num_n + i_n, t, o_n, m_n, out, stride_out, shared,
                          shared_gate, stride_shared, stride_gate, TOPK, HAS_SHARED, HAS_GATE)


@cached_launch
@triton.jit
def _combine_kernel(rows, shared, shared_gate, out, stride_shared, stride_gate, stride_out, H,
                    TOP_K: tl.constexpr, HAS_SHARED: tl.constexpr, HAS_GATE: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[t] = sum_j rows[t * TOP_K + j] (+ sigmoid(shared_gate[t]) * shared[t]): sums in float32,
    rounded to the model dtype where the eager model rounds (the experts' sum, the gate, the gated
    shared output, the total), so bf16 results follow HF's. Launched with enable_fp_fusion=False: a
    fused multiply-add of the gate and the shared output into the sum skips the product's rounding,
    one ulp off in many of the gated elements."""
    dtype = out.dtype.element_ty
    t = tl.program_id(0).to(tl.int64)
    o_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        acc += tl.load(rows + (t * TOP_K + j) * H + o_h, mask=m_h, other=0.0).to(tl.float32)
    acc = finish_combine(acc, shared, shared_gate, t, o_h, m_h, stride_shared, stride_gate, dtype, HAS_SHARED,
                          HAS_GATE)
    tl.store(out + t * stride_out + o_h, acc, mask=m_h)


def _check_shared(shared: torch.Tensor | None, shared_gate: torch.Tensor | None, t: int, h: int) -> None:
    if shared is not None:
        assert shared.shape == (t, h) and shared.stride(-1) == 1, f"shared {tuple(shared.shape)} != [{t}, {h}]"
    if shared_gate is not None:
        assert shared is not None and shared_gate.shape == (t,), f"shared_gate {tuple(shared_gate.shape)} != [{t}]"


def _combine(out_rows: torch.Tensor, t: int, k: int, shared: torch.Tensor | None,
             shared_gate: torch.Tensor | None) -> torch.Tensor:
    h = out_rows.shape[1]
    out = torch.empty((t, h), dtype=out_rows.dtype, device=out_rows.device)
    _check_shared(shared, shared_gate, t, h)
    block_h = min(1024, next_power_of_2(h))
    _combine_kernel[(t, cdiv(h, block_h))](
        out_rows, shared, shared_gate, out, 0 if shared is None else shared.stride(0),
        0 if shared_gate is None else shared_gate.stride(0), out.stride(0), h, TOP_K=k,
        HAS_SHARED=shared is not None, HAS_GATE=shared_gate is not None, BLOCK_H=block_h, enable_fp_fusion=False)
    return out


UNSORTED_MAX_ROWS = 32
GEMV_MAX_ROWS = 64  # past this the tensor-core kernels serve: their row blocks read each expert's weight once


def _gemm_configs(num_rows: int, num_experts: int, dtype: torch.dtype, device: torch.device) -> tuple[dict, dict]:
    """(up, down) launch configs: BLOCK_M/N/K, num_warps, num_stages, by the rows an expert gets on
    average (T*k / E). From H200 sweeps at E 256 / top-8 and E 512 / top-10, H 2048, I 512, bf16:
    up to 16 rows (decode, small batches; memory-bound, 91-99 % of copy bandwidth from T = 32 on),
    16-row blocks and narrow column tiles that spread the weight stream over every SM; more rows,
    taller blocks; from 64 rows (prefill), 128-row blocks on two warpgroups, so that most experts'
    weights are read by one row block (T4096: 0.83 -> 0.79 ms at E 256, 1.29 -> 1.13 ms at E 512
    against 64-row blocks)."""
    if device.type != "cuda":  # the interpreter: the smallest tiles
        tiny = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, num_warps=4, num_stages=1)
        return tiny, tiny
    per_expert = num_rows / num_experts
    if per_expert <= 16:
        up = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=4)
        down = dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4)
    elif per_expert <= 24:
        up = dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)
        down = dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4)
    elif per_expert <= 64:
        up = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=4)
        down = dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)
    else:
        up = dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, num_warps=8, num_stages=3)
        down = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)
    if dtype == torch.float32:  # tests: twice the bytes per tile
        up, down = ({**c, "BLOCK_K": min(c["BLOCK_K"], 64), "num_stages": 2} for c in (up, down))
    return up, down


def _fused_moe_fwd(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor, activation: str, up_config: dict | None = None,
                   down_config: dict | None = None, shared: torch.Tensor | None = None,
                   shared_gate: torch.Tensor | None = None, partial: bool = False,
                   w13_scale: torch.Tensor | None = None, w2_scale: torch.Tensor | None = None,
                   unsorted: bool | None = None, path: str | None = None) -> torch.Tensor:
    """fused_moe, with what the benchmarks vary. Launch configs (dicts of BLOCK_M/N/K, num_warps,
    num_stages); explicit ones take the sorted path unless `unsorted` says otherwise (None: unsorted up
    to UNSORTED_MAX_ROWS assignments with the default configs). path: "gemv" runs the few-token expert
    GEMVs (moe_gemv.py; up to GEMV_MAX_ROWS assignments, nothing else varied), "dot" the tensor-core
    kernels above; None: on CUDA up to GEMV_MAX_ROWS assignments (FP8 or 16-bit experts), whichever of
    the two timed faster at this shape (fastest.py), else "dot"."""
    if activation not in ("silu", "relu2"):
        raise ValueError(f"unsupported MoE activation {activation!r}; expected 'silu' or 'relu2'")
    gated = activation == "silu"
    t, h = x.shape
    e, i = w2.shape[0], w2.shape[2]
    assert w13.shape == (e, (2 if gated else 1) * i, h) and w2.shape == (e, h, i), (
        f"{activation} experts need w13 [E, {'2I' if gated else 'I'}, H] and w2 [E, H, I]; got x {tuple(x.shape)}, "
        f"w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}")
    assert topk_ids.shape == topk_weights.shape and topk_ids.shape[0] == t, (
        f"topk_ids {tuple(topk_ids.shape)} and topk_weights {tuple(topk_weights.shape)} must both be [{t}, k]")
    assert x.stride(-1) == 1 and w13.stride(-1) == 1 and w2.stride(-1) == 1, "x, w13, w2 need unit last strides"
    fp8 = w13_scale is not None
    if fp8:
        def blocks(w: torch.Tensor) -> tuple[int, int, int]:
            return e, cdiv(w.shape[1], FP8_BLOCK), cdiv(w.shape[2], FP8_BLOCK)

        assert w13.dtype == w2.dtype == FP8_DTYPE and w2_scale is not None, "FP8 experts need both weights e4m3"
        assert w13_scale.shape == blocks(w13) and w2_scale.shape == blocks(w2), (
            f"scales {tuple(w13_scale.shape)} / {tuple(w2_scale.shape)} for w13 {tuple(w13.shape)} / w2 "
            f"{tuple(w2.shape)}: one per 128 x 128 block of each expert")
        assert w13_scale.stride(-1) == w2_scale.stride(-1) == 1, "scales need unit last strides"
    k = topk_ids.shape[1]
    rows = t * k
    if rows == 0:  # no tokens
        return torch.zeros_like(x)
    defaults = up_config is None and down_config is None and unsorted is None
    if path is None and defaults and rows <= GEMV_MAX_ROWS and x.is_cuda:
        path = _few_rows_path(x, w13, w2, topk_weights, topk_ids, activation, shared, shared_gate, partial,
                              w13_scale, w2_scale)
    if path == "gemv":
        assert defaults and rows <= GEMV_MAX_ROWS, f"the gemv path takes up to {GEMV_MAX_ROWS} assignments"
        _check_shared(shared, shared_gate, t, h)
        return expert_gemvs(x, w13, w2, w13_scale, w2_scale, topk_weights.float().contiguous(), topk_ids, gated,
                            shared, shared_gate)
    if unsorted is None:
        unsorted = rows <= UNSORTED_MAX_ROWS and up_config is None and down_config is None
    if unsorted:  # a few tokens: each assignment is its own row block, its expert read from topk_ids
        sorted_assign = expert_offsets = topk_ids.reshape(-1).contiguous()  # (no offsets: unused)
    else:
        sorted_assign, expert_offsets = sort_by_expert(topk_ids=topk_ids, num_experts=e)
    default_up, default_down = _gemm_configs(rows, e, x.dtype, x.device)
    up, down = up_config or default_up, down_config or default_down
    assert not fp8 or FP8_BLOCK % up["BLOCK_K"] == FP8_BLOCK % down["BLOCK_K"] == 0, "K tiles within a scale block"
    s13, s2 = (w13_scale, w2_scale) if fp8 else (w13, w2)  # without FP8 the weights stand in, unread

    def programs(config: dict, columns: int) -> tuple[int]:
        blocks = rows if unsorted else max_blocks(rows, e, config["BLOCK_M"])
        return (blocks * cdiv(columns, config["BLOCK_N"]),)

    prec = "tf32x3" if x.dtype == torch.float32 else "tf32"
    num_bins = bins_for(e)
    inter = torch.empty((rows, i), dtype=x.dtype, device=x.device)
    _moe_up_kernel[programs(up, i)](
        x, w13, s13, inter, sorted_assign, expert_offsets, x.stride(0), w13.stride(0), w13.stride(1), s13.stride(0),
        s13.stride(1), inter.stride(0), h, i, e, TOPK=k, GATED=gated, PREC=prec, NUM_BINS=num_bins,
        EVEN_K=h % up["BLOCK_K"] == 0, UNSORTED=unsorted, FP8_W=fp8, **up)
    weights = topk_weights.float().contiguous()
    if unsorted:  # the down kernel sums each token's slots (float32 rows as scratch): no combine launch
        _check_shared(shared, shared_gate, t, h)
        out_rows = parts_scratch(x.device, rows * h).view(rows, h)
        out = torch.empty_like(x)
        counters = arrival_counters(x.device, t * cdiv(h, down["BLOCK_N"]))
    else:  # [T*k, H], row t * k + j; the rows of slots routed elsewhere (partial) are never written
        out_rows = (torch.zeros if partial else torch.empty)((rows, h), dtype=x.dtype, device=x.device)
        out = counters = out_rows  # (unused)
    _moe_down_kernel[programs(down, h)](
        inter, w2, s2, out_rows, sorted_assign, expert_offsets, weights, out, shared, shared_gate, counters,
        inter.stride(0), w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), out_rows.stride(0), out.stride(0),
        0 if shared is None else shared.stride(0), 0 if shared_gate is None else shared_gate.stride(0), h, i, e,
        TOPK=k, PREC=prec, NUM_BINS=num_bins, EVEN_K=i % down["BLOCK_K"] == 0, UNSORTED=unsorted, FP8_W=fp8,
        SUM_SLOTS=unsorted, HAS_SHARED=shared is not None, HAS_GATE=shared_gate is not None, enable_fp_fusion=False,
        **down)
    if unsorted:
        return out
    if k == 1 and shared is None:
        return out_rows
    return _combine(out_rows, t, k, shared, shared_gate)


def _few_rows_path(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                   topk_ids: torch.Tensor, activation: str, shared: torch.Tensor | None,
                   shared_gate: torch.Tensor | None, partial: bool, w13_scale: torch.Tensor | None,
                   w2_scale: torch.Tensor | None) -> str:
    """"dot" or "gemv" for a few tokens on CUDA: whichever ran this shape faster, timed once per shape
    (the first call comes in the decode graphs' warm-up, before capture); "dot" until timed."""
    key = ("fused_moe_few_rows", tuple(x.shape), tuple(w13.shape), tuple(topk_ids.shape), x.dtype, w13.dtype,
           activation, shared is not None, shared_gate is not None, partial, x.device)

    def runs() -> dict:
        return {path: functools.partial(_fused_moe_fwd, x, w13, w2, topk_weights, topk_ids, activation, shared=shared,
                                        shared_gate=shared_gate, partial=partial, w13_scale=w13_scale,
                                        w2_scale=w2_scale, path=path)
                for path in ("dot", "gemv")}

    return fastest(key, runs) or "dot"


def fused_moe(
    *,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    shared: torch.Tensor | None = None,
    shared_gate: torch.Tensor | None = None,
    partial: bool = False,
    w13_scale: torch.Tensor | None = None,
    w2_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """fused_moe_ref on Triton kernels: x: [T, H]; w13: [E, 2I, H] ("silu") or [E, I, H] ("relu2");
    w2: [E, H, I]; topk_weights: [T, k] float32; topk_ids: [T, k] ints in [0, E) (or E where partial:
    the sort and the unsorted blocks skip those slots, whose rows stay zero); shared: [T, H] or None;
    shared_gate: [T] logits or None; w13_scale, w2_scale: FP8 experts' block scales (module docstring).
    Returns [T, H] in x's dtype. The k weighted expert rows and the shared expert are summed in one
    kernel. No host sync: safe inside CUDA-graph capture."""
    return _fused_moe_fwd(x, w13, w2, topk_weights, topk_ids, activation, shared=shared, shared_gate=shared_gate,
                          partial=partial, w13_scale=w13_scale, w2_scale=w2_scale)
