"""The fused MoE for a few tokens as expert GEMVs on the CUDA cores: out[t] = sum_j w[t, j] * y_{e(t, j)}(x[t])
(+ the shared expert), the contract of fused_moe.py. Its dispatcher runs this for FP8 and 16-bit experts
where it timed faster than the tensor-core kernels at the shape (fastest.py), as it does at a few tokens.

With few tokens (decode at small batch) each (token, slot) assignment a = t * k + j has an expert of its
own, so each is one matrix-vector product per GEMM. The tensor-core kernels pad that row to 16 and walk
each program's K loop in order; here the programs multiply [BLOCK_N, G * 128] weight tiles (K contiguous,
FP8 widened in registers) element-wise with the activations and sum over K once, after the loop. Narrow
BLOCK_N gives many programs, so the selected experts' weights stream from every SM at once. Launch
configs are tuned per shape on CUDA.
  up:   inter[a] = act(w13[e] @ x[t])              [T*k, I] in x's dtype; a program per (a, column block)
  down: out[t] = sum_j w[t, j] * (w2[e_j] @ inter[t*k + j]), then the shared expert added as the combine
        does; a program per (t, column block) walks the token's k slots and their K tiles in one loop:
        two launches, no scratch, deterministic.
FP8 experts (e4m3 with 128 x 128 block scales, fp8_quant.py): a program's BLOCK_N rows (dividing 128) lie in one
128-row block, so each K step multiplies its activation tile by the G block scales of those rows and the
weights widen straight into one multiply-add each; the result is that of the dequantized weight. (Where the
up half's rows can straddle a block, an intermediate size not a multiple of 32, each product is scaled instead.)"""

import torch
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.fastest import graph_time
from triton_kernels.host_math import cdiv, next_power_of_2
from triton_kernels.moe_epilogue import expert_activation, finish_combine


@triton.jit
def _products(p_w, m_w, b_x):
    """The weight tile at p_w [BLOCK_N, G, 128] (m_w: in range), widened to float32, times b_x [1, G, 128]."""
    return tl.load(p_w, mask=m_w, other=0.0).to(tl.float32) * b_x


@triton.jit
def _block_scaled(b_x, p_s, m_s, FP8_W: tl.constexpr):
    """b_x [1, G, 128] float32 times the G block scales at p_s [G] (m_s: in range) of the weight rows it meets;
    b_x as it is without FP8_W."""
    if FP8_W:
        b_x = b_x * tl.load(p_s, mask=m_s, other=0.0)[None, :, None]
    return b_x


@triton.jit
def _up_gemv_kernel(x, w13, s13, inter, ids, stride_x, stride_we, stride_wn, stride_se, stride_sn, stride_inter,
                    H, I, E, ROWS_BUCKET, TOPK: tl.constexpr, GATED: tl.constexpr, FP8_W: tl.constexpr,
                    ROW_SCALES: tl.constexpr, BLOCK_N: tl.constexpr, G: tl.constexpr, STAGES: tl.constexpr):
    """Program (a, i_n): inter[a, o_n] = act(w13[e] rows o_n (and I + o_n) . x[a // TOPK]), e = ids[a];
    nothing for e >= E (an expert held elsewhere). K tiles are G x 128 wide. ROWS_BUCKET keys the tuner.
    FP8_W: x is scaled per K block by the block scale of the program's rows, or (ROW_SCALES: the up rows
    I + o_n may straddle a 128-row block) each product by its row's."""
    tl.static_assert(128 % BLOCK_N == 0)
    num_n = tl.cdiv(I, BLOCK_N)
    a, i_n = tl.program_id(0) // num_n, tl.program_id(0) % num_n
    i_e = tl.load(ids + a).to(tl.int64)
    if i_e >= E:
        return
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < I
    o_g = tl.arange(0, G)
    o_k = o_g[:, None] * 128 + tl.arange(0, 128)[None, :]  # [G, 128]
    p_x = x + (a // TOPK).to(tl.int64) * stride_x + o_k[None, :, :]
    p_w = w13 + i_e * stride_we + o_n.to(tl.int64)[:, None, None] * stride_wn + o_k[None, :, :]
    p_s = s13 + i_e * stride_se + (i_n * BLOCK_N // 128) * stride_sn + o_g  # [G] (FP8_W)
    p_su = s13 + i_e * stride_se + ((I + i_n * BLOCK_N) // 128) * stride_sn + o_g
    p_su_rows = s13 + i_e * stride_se + ((I + o_n) // 128)[:, None, None] * stride_sn + o_g[None, :, None]
    acc = tl.zeros([BLOCK_N, G, 128], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, G, 128], dtype=tl.float32)
    for k0 in tl.range(0, H, G * 128, num_stages=STAGES):
        m_k = (k0 + o_k < H)[None, :, :]
        m_w = m_n[:, None, None] & m_k
        m_s = k0 + o_g * 128 < H
        b_x = tl.load(p_x + k0, mask=m_k, other=0.0).to(tl.float32)
        acc += _products(p_w + k0, m_w, _block_scaled(b_x, p_s + k0 // 128, m_s, FP8_W))
        if GATED:
            p_up = p_w + I * stride_wn + k0
            if FP8_W and ROW_SCALES:
                acc_up += _products(p_up, m_w, b_x) * tl.load(p_su_rows + k0 // 128, mask=m_n[:, None, None] &
                                                              m_s[None, :, None], other=0.0)
            else:
                acc_up += _products(p_up, m_w, _block_scaled(b_x, p_su + k0 // 128, m_s, FP8_W))
    b_h = expert_activation(tl.sum(tl.sum(acc, 2), 1), tl.sum(tl.sum(acc_up, 2), 1), GATED)
    tl.store(inter + a.to(tl.int64) * stride_inter + o_n, b_h.to(inter.dtype.element_ty), mask=m_n)


@triton.jit
def _down_gemv_kernel(inter, w2, s2, ids, topk_weights, out, shared, shared_gate, stride_inter, stride_we, stride_wh,
                      stride_se, stride_sh, stride_out, stride_shared, stride_gate, H, I, E, ROWS_BUCKET,
                      TOPK: tl.constexpr, FP8_W: tl.constexpr, HAS_SHARED: tl.constexpr, HAS_GATE: tl.constexpr,
                      BLOCK_N: tl.constexpr, G: tl.constexpr, STAGES: tl.constexpr):
    """Program (t, i_n): out[t, o_n] = sum_j topk_weights[t, j] * (w2[e_j] rows o_n . inter[t * TOPK + j]),
    finished as the combine does. One loop walks the token's TOPK slots and each slot's K tiles (TOPK *
    ceil(I / (G * 128)) steps, so the weight stream of every slot is pipelined as one), each activation
    tile weighted by its slot's routing weight; the products are summed once after the loop. No scratch
    rows and no counters: the program holds every slot of its columns, and sums them in a fixed order.
    Slots of an expert e >= E add 0. FP8_W: each activation tile is also scaled by the program's rows' block scales."""
    tl.static_assert(128 % BLOCK_N == 0)
    num_n = tl.cdiv(H, BLOCK_N)
    t, i_n = tl.program_id(0) // num_n, tl.program_id(0) % num_n
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_n = o_n < H
    o_g = tl.arange(0, G)
    o_k = o_g[:, None] * 128 + tl.arange(0, 128)[None, :]  # [G, 128]
    p_w = w2 + o_n.to(tl.int64)[:, None, None] * stride_wh + o_k[None, :, :]
    p_s = s2 + (i_n * BLOCK_N // 128) * stride_sh + o_g  # [G] (FP8_W)
    k_steps = tl.cdiv(I, G * 128)
    acc = tl.zeros([BLOCK_N, G, 128], dtype=tl.float32)
    for step in tl.range(0, TOPK * k_steps, num_stages=STAGES):
        a = t * TOPK + step // k_steps
        k0 = (step % k_steps) * (G * 128)
        i_e = tl.load(ids + a).to(tl.int64)
        k_end = tl.where(i_e < E, I, 0)  # a slot held elsewhere reads nothing
        i_e = tl.where(i_e < E, i_e, 0)
        m_k = (k0 + o_k < k_end)[None, :, :]
        b_a = tl.load(inter + a.to(tl.int64) * stride_inter + k0 + o_k[None, :, :], mask=m_k, other=0.0)
        b_a = b_a.to(tl.float32) * tl.load(topk_weights + a)
        b_a = _block_scaled(b_a, p_s + i_e * stride_se + k0 // 128, k0 + o_g * 128 < k_end, FP8_W)
        acc += _products(p_w + i_e * stride_we + k0, m_n[:, None, None] & m_k, b_a)
    b_out = finish_combine(tl.sum(tl.sum(acc, 2), 1), shared, shared_gate, t, o_n, m_n, stride_shared, stride_gate,
                           out.dtype.element_ty, HAS_SHARED, HAS_GATE)
    tl.store(out + t.to(tl.int64) * stride_out + o_n, b_out, mask=m_n)


def _configs(shapes: list[tuple[int, int, int, int]]) -> list[triton.Config]:
    """(BLOCK_N, K tile width, warps, stages) -> configs with G = width / 128."""
    return [triton.Config({"BLOCK_N": bn, "G": bk // 128, "STAGES": st}, num_warps=w) for bn, bk, w, st in shapes]


# Up: K = H is long (2048 at the Qwen3.5 / Qwen3-Next MoE shapes), each program reads gate and up rows; the
# configs are those that come first at some dtype and T on the H200 (8-warp ones never do).
# Down: a program per (token, column block) streams every slot's rows, so the column blocks are narrow
# (H / BLOCK_N programs per token) and the loop long (TOPK * I / (G * 128) steps); no single config is the
# fastest at every T, so the autotuner picks per shape.
_up_tuned = cached_launch(triton.autotune(
    configs=_configs([(4, 512, 4, 2), (8, 256, 4, 3), (8, 512, 4, 3), (16, 256, 4, 3)]),
    key=["H", "I", "ROWS_BUCKET", "TOPK", "GATED", "FP8_W"], do_bench=graph_time)(_up_gemv_kernel))
_down_tuned = cached_launch(triton.autotune(
    configs=_configs([(4, 256, 4, 3), (8, 256, 4, 3), (8, 512, 4, 3), (16, 256, 4, 4), (4, 512, 4, 4),
                      (8, 128, 4, 4)]),
    key=["H", "I", "ROWS_BUCKET", "TOPK", "FP8_W", "HAS_SHARED", "HAS_GATE"], do_bench=graph_time)(_down_gemv_kernel))
_INTERPRETER = dict(BLOCK_N=16, G=1, STAGES=1, num_warps=4)  # one config off CUDA (the interpreter cannot time configs)


def expert_gemvs(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, s13: torch.Tensor | None,
                 s2: torch.Tensor | None, topk_weights: torch.Tensor, topk_ids: torch.Tensor, gated: bool,
                 shared: torch.Tensor | None, shared_gate: torch.Tensor | None,
                 configs: tuple[dict, dict] | None = None) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I or I, H]; w2 [E, H, I]; s13, s2: FP8 block scales or None; topk_weights
    [T, k] float32 contiguous; topk_ids [T, k] (E: an expert held elsewhere, adds nothing); shared
    [T, H] or None; shared_gate [T] or None -> [T, H] in x's dtype. Arguments are checked by the caller
    (fused_moe.py: _fused_moe_fwd). configs: (up, down) dicts of BLOCK_N, G, STAGES, num_warps instead
    of the tuned ones (the benchmarks)."""
    (t, h), (e, _, i), k = x.shape, w2.shape, topk_ids.shape[1]
    rows = t * k
    fp8 = s13 is not None
    s13, s2 = (s13, s2) if fp8 else (w13, w2)  # without FP8 the weights stand in, unread
    ids = topk_ids.reshape(-1).contiguous()
    inter = torch.empty((rows, i), dtype=x.dtype, device=x.device)
    out = torch.empty_like(x)
    bucket = next_power_of_2(rows)
    up_args = (x, w13, s13, inter, ids, x.stride(0), w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1),
               inter.stride(0), h, i, e, bucket)
    up_flags = dict(TOPK=k, GATED=gated, FP8_W=fp8, ROW_SCALES=fp8 and gated and i % 32 != 0)  # BLOCK_N <= 32
    down_args = (inter, w2, s2, ids, topk_weights, out, shared, shared_gate, inter.stride(0), w2.stride(0),
                 w2.stride(1), s2.stride(0), s2.stride(1), out.stride(0),
                 0 if shared is None else shared.stride(0), 0 if shared_gate is None else shared_gate.stride(0),
                 h, i, e, bucket)
    down_flags = dict(TOPK=k, FP8_W=fp8, HAS_SHARED=shared is not None, HAS_GATE=shared_gate is not None)
    if configs is None and not x.is_cuda:
        configs = (_INTERPRETER, _INTERPRETER)
    if configs is None:
        _up_tuned[lambda meta: (rows * cdiv(i, meta["BLOCK_N"]),)](*up_args, **up_flags)
        _down_tuned[lambda meta: (t * cdiv(h, meta["BLOCK_N"]),)](
            *down_args, **down_flags, enable_fp_fusion=False)
    else:
        up, down = configs
        _up_gemv_kernel[(rows * cdiv(i, up["BLOCK_N"]),)](*up_args, **up_flags, **up)
        _down_gemv_kernel[(t * cdiv(h, down["BLOCK_N"]),)](*down_args, **down_flags, **down,
                                                                  enable_fp_fusion=False)
    return out


def tuned_configs() -> tuple[list[dict], list[dict]]:
    """The configs the tuner tries, (up, down), as expert_gemvs takes them."""
    return tuple([{**c.kwargs, "num_warps": c.num_warps} for c in tuned.configs] for tuned in (_up_tuned, _down_tuned))
