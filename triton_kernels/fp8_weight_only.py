"""FP8-weight GEMM for few rows (decode): y = x @ dequant(w)^T with x unquantized. Formats in fp8_quant.py.
The same tensor-core kernel, unscaled, also serves 16-bit weights (dense_few_rows_gemm).

At decode a linear layer's time is the time to read its weight, so the e4m3 weight is read at one
byte per value and widened in registers to x's dtype (e4m3 values are exact in bf16, fp16 and fp32);
x is not quantized. Each 128-wide K tile is one weight-scale block: its partial sum over the tile is
multiplied by the column's block scale, so the products are those of x with the dequantized weight
and the result matches `dequantize, then matmul` to float32 rounding. Programs split the output
columns finely (8 to 128 per program) so that enough of them stream the weight at once.
One or two rows of x (batch-1/2 decode) run on the CUDA cores (`_gemv_kernel`); more rows on the
tensor cores, with the weight as the register operand (`_dot_kernel`, y^T = w x^T).
A gated MLP's gate_up can run as one GEMV that writes silu(gate) * up (fp8_weight_only_gated_gemm).
"""

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from triton_kernels.arrival_counters import arrival_counters, parts_scratch
from triton_kernels.cached_launch import cached_launch
from triton_kernels.fastest import fastest, graph_time
from triton_kernels.fp8_quant import FP8_BLOCK, FP8_DTYPE, dequantize_fp8, f16_rows
from triton_kernels.host_math import cdiv, next_power_of_2
from triton_kernels.norms import silu_and_mul, silu_and_mul_ref

# Rows past which the GEMMs quantize activations too (fp8_gemm.py). From 17 rows on those e4m3 x e4m3 GEMMs
# are faster on most shapes, but quantizing the activations of batched short prefills costs the default model
# its greedy agreement with the unquantized one (tests/test_fp8_default_model.py), which comes first.
WEIGHT_ONLY_MAX_ROWS = 64


def fp8_weight_only_gemm_ref(*, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                             bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [M, K]; weight: [N, K] e4m3; weight_scale_inv: [ceil(N/128), ceil(K/128)] float32; bias: [N] or
    None. Returns [M, N] in x's dtype: dequantize the weight to float32, one float32 matmul."""
    y = F.linear(x.float(), dequantize_fp8(weight, weight_scale_inv))
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


@triton.jit
def _gemv_kernel(x, w, s, b, y, M, N, K, stride_xm, stride_wn, stride_sn, stride_ym, HAS_BIAS: tl.constexpr,
                 GATED: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 STAGES: tl.constexpr):
    """M <= ROWS (1 or 2): BLOCK_N output columns of every row, on the CUDA cores. Each step reads a
    [BLOCK_N, BLOCK_K] weight tile (K contiguous), widens it to float32 and adds its products with x,
    scaled per 128-wide block, into an element-wise accumulator that is summed once after the K loop
    (as the MoE expert GEMVs do, moe_gemv.py): a reduction in every step would hold up the loads, which
    set this kernel's time. STAGES steps of loads are in flight at once. The program's BLOCK_N columns
    (dividing 128) share one 128-row scale block, so x is scaled per K block and each weight takes one
    multiply-add.

    GATED (a gated MLP's gate_up, N = I a multiple of 128): w holds 2N rows [gate; up], the program also sums
    the up rows N + o_n, and y [M, N] gets silu(gate) * up, rounded as silu_and_mul rounds the plain result."""
    tl.static_assert(128 % BLOCK_N == 0)
    G: tl.constexpr = BLOCK_K // 128
    i_n = tl.program_id(0)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_m = tl.arange(0, ROWS)
    o_k = tl.arange(0, BLOCK_K)
    o_g = tl.arange(0, G)
    m_n, m_m = o_n < N, o_m < M
    p_w = w + o_n.to(tl.int64)[:, None] * stride_wn + o_k[None, :]  # [BLOCK_N, BLOCK_K]
    p_x = x + o_m.to(tl.int64)[:, None] * stride_xm + o_k[None, :]  # [ROWS, BLOCK_K]
    p_s = s + (i_n * BLOCK_N // 128) * stride_sn + o_g  # [G]
    acc = tl.zeros((ROWS, BLOCK_N, G, 128), dtype=tl.float32)
    acc_up = tl.zeros((ROWS, BLOCK_N, G, 128), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        m_k = (k0 + o_k) < K
        m_w, m_g = m_n[:, None] & m_k[None, :], k0 + o_g * 128 < K
        b_x = tl.load(p_x + k0, mask=m_m[:, None] & m_k[None, :], other=0.0).to(tl.float32)
        b_x = tl.reshape(b_x, (ROWS, 1, G, 128))
        b_s = tl.load(p_s + k0 // 128, mask=m_g, other=0.0)
        b_w = tl.load(p_w + k0, mask=m_w, other=0.0).to(tl.float32)
        acc += tl.reshape(b_w, (1, BLOCK_N, G, 128)) * (b_x * b_s[None, None, :, None])
        if GATED:
            b_s = tl.load(p_s + (N // 128) * stride_sn + k0 // 128, mask=m_g, other=0.0)
            b_w = tl.load(p_w + N * stride_wn + k0, mask=m_w, other=0.0).to(tl.float32)
            acc_up += tl.reshape(b_w, (1, BLOCK_N, G, 128)) * (b_x * b_s[None, None, :, None])
    y_rows = tl.sum(tl.sum(acc, 3), 2)  # [ROWS, BLOCK_N]
    if HAS_BIAS:
        y_rows += tl.load(b + o_n, mask=m_n, other=0.0).to(tl.float32)[None, :]
    if GATED:  # each rounding where the plain GEMV, then silu_and_mul, round
        up = tl.sum(tl.sum(acc_up, 3), 2)
        if HAS_BIAS:
            up += tl.load(b + N + o_n, mask=m_n, other=0.0).to(tl.float32)[None, :]
        gate = y_rows.to(y.dtype.element_ty).to(tl.float32)
        act = (gate * tl.sigmoid(gate)).to(y.dtype.element_ty).to(tl.float32)
        y_rows = act * up.to(y.dtype.element_ty).to(tl.float32)
    p_y = y + o_m.to(tl.int64)[:, None] * stride_ym + o_n[None, :]
    tl.store(p_y, y_rows.to(y.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


@triton.jit
def _dot_kernel(x, w, s, b, y, partials, arrivals, M, N, K, stride_xm, stride_wn, stride_sn, stride_ym,
                HAS_BIAS: tl.constexpr, EXACT_DOT: tl.constexpr, F16_OPERANDS: tl.constexpr, M_BUCKET: tl.constexpr,
                SCALED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                SPLIT_K: tl.constexpr):
    """M <= BLOCK_M (16 to 64): a [BLOCK_N, BLOCK_M] tile of y^T = w @ x^T on the tensor cores, the
    widened weight tile as the register operand; BLOCK_K is the 128-wide scale block, so each step's
    partial sum is scaled per output column. SCALED False: w is in x's dtype (16-bit decode linears,
    dense_few_rows_gemm), unscaled. M_BUCKET only keys the autotuner. EXACT_DOT: float32 x,
    multiplied in full float32 (no tf32). F16_OPERANDS (bf16 x): both operands go to fp16, each
    token's tile scaled by a power of two (fp8_quant.py: f16_rows), e4m3 widened by one conversion per pair.

    SPLIT_K > 1 (narrow N, long K: more programs stream the weight): program (i_n, i_k) sums its K
    range into partials [SPLIT_K, BLOCK_M, N] float32 and counts itself in arrivals[i_n]; the last
    to arrive adds the SPLIT_K partials in order, writes y and sets the count back to 0."""
    i_n, i_k = tl.program_id(0), tl.program_id(1)
    o_m = tl.arange(0, BLOCK_M)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_k = tl.arange(0, BLOCK_K)
    m_m, m_n = o_m < M, o_n < N
    p_w = w + o_n.to(tl.int64)[:, None] * stride_wn + o_k[None, :]  # [BLOCK_N, BLOCK_K]
    p_x = x + o_m.to(tl.int64)[None, :] * stride_xm + o_k[:, None]  # [BLOCK_K, BLOCK_M] view of x^T
    p_s = s + (o_n // BLOCK_K) * stride_sn
    k_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(i_k * k_split, tl.minimum(K, (i_k + 1) * k_split), BLOCK_K):
        m_k = (k0 + o_k) < K
        b_x = tl.load(p_x + k0, mask=m_k[:, None] & m_m[None, :], other=0.0)
        b_w = tl.load(p_w + k0, mask=m_n[:, None] & m_k[None, :], other=0.0)
        if F16_OPERANDS:
            b_x16, shift = f16_rows(b_x, 0)  # [BLOCK_K, BLOCK_M], [BLOCK_M]
            part = tl.dot(b_w.to(tl.float16), b_x16) * tl.exp2(-shift)[None, :]
        elif EXACT_DOT:
            part = tl.dot(b_w.to(b_x.dtype), b_x, input_precision="ieee")
        else:
            part = tl.dot(b_w.to(b_x.dtype), b_x)
        if SCALED:
            acc += part * tl.load(p_s + k0 // BLOCK_K, mask=m_n, other=0.0)[:, None]  # [BLOCK_N] scales
        else:
            acc += part
    p_y = y + o_m.to(tl.int64)[None, :] * stride_ym + o_n[:, None]
    m_y = m_n[:, None] & m_m[None, :]
    if SPLIT_K > 1:
        p_part = partials + o_m[None, :] * N + o_n[:, None]  # [BLOCK_N, BLOCK_M] of split 0
        tl.store(p_part + i_k * BLOCK_M * N, acc, mask=m_y)
        tl.debug_barrier()  # every thread's partial is written before the count says so
        if tl.atomic_add(arrivals + i_n, 1, sem="acq_rel") == SPLIT_K - 1:  # the others' partials are in
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for j in tl.static_range(SPLIT_K):
                acc += tl.load(p_part + j * BLOCK_M * N, mask=m_y, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                acc += tl.load(b + o_n, mask=m_n, other=0.0).to(tl.float32)[:, None]
            tl.store(p_y, acc.to(y.dtype.element_ty), mask=m_y)
            tl.atomic_xchg(arrivals + i_n, 0)
    else:
        if HAS_BIAS:
            acc += tl.load(b + o_n, mask=m_n, other=0.0).to(tl.float32)[:, None]
        tl.store(p_y, acc.to(y.dtype.element_ty), mask=m_y)


def gemv_configs_that_fit(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """The GEMV configs whose float32 accumulators (ROWS x BLOCK_N x BLOCK_K, twice when GATED) take at most 128
    registers a thread; more spill when built for sm_90a (tests/kernels/test_fp8_sm90_compile.py)."""
    parts = kwargs["ROWS"] * (2 if kwargs["GATED"] else 1)
    return [c for c in configs if parts * c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_K"] <= 128 * 32 * c.num_warps]


# The GEMV's loads are latency-bound, so two to six stages of them stay in flight (loads straight to registers
# are far slower). Each config below is the fastest, or within 2 % of it, at some served shape of one or two rows.
_gemv_tuned = cached_launch(triton.autotune(
    configs=[triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "STAGES": st}, num_warps=w)
             for bn, bk, w, st in [(8, 512, 4, 2), (8, 512, 4, 3), (16, 256, 4, 3), (16, 512, 4, 2),
                                   (8, 512, 4, 4), (8, 512, 4, 5), (16, 256, 4, 4), (16, 256, 4, 5), (4, 512, 2, 6)]],
    key=["N", "K", "ROWS", "GATED"], prune_configs_by={"early_config_prune": gemv_configs_that_fit},
    do_bench=graph_time)(_gemv_kernel))
_dot_tuned = cached_launch(triton.autotune(
    configs=[triton.Config({"BLOCK_N": bn, "SPLIT_K": sk}, num_warps=w, num_stages=st)
             for bn, sk, w, st in [(16, 1, 4, 4), (16, 1, 4, 6), (32, 1, 4, 4), (64, 1, 4, 4), (64, 1, 4, 6),
                                   (128, 1, 4, 4), (32, 2, 4, 4), (64, 2, 4, 4), (32, 4, 4, 4), (64, 4, 4, 4),
                                   (16, 4, 4, 6), (64, 8, 4, 4)]],
    key=["N", "K", "M_BUCKET", "F16_OPERANDS", "SCALED"], do_bench=graph_time)(_dot_kernel))
GEMV_MAX_ROWS = 2


def fp8_weight_only_gemm(*, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as fp8_weight_only_gemm_ref, for M <= WEIGHT_ONLY_MAX_ROWS: x [M, K], weight [N, K]
    e4m3, weight_scale_inv [ceil(N/128), ceil(K/128)] float32, bias [N] or None -> [M, N] in x's dtype.
    On CUDA the launch config is tuned once per (N, K, M bucket) on first use, before graph capture."""
    _check(x, weight, weight_scale_inv, bias)
    x, weight, weight_scale_inv = x.contiguous(), weight.contiguous(), weight_scale_inv.contiguous()
    y = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    if x.shape[0]:
        _launch(x, weight, weight_scale_inv, bias, y, _kernel_for(x, weight, weight_scale_inv, bias))
    return y


def _check(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor, bias: torch.Tensor | None) -> None:
    m, k = x.shape
    n = weight.shape[0]
    assert m <= WEIGHT_ONLY_MAX_ROWS, f"{m} rows: use fp8_gemm above {WEIGHT_ONLY_MAX_ROWS}"
    assert weight.shape == (n, k) and weight.dtype == FP8_DTYPE, f"weight {tuple(weight.shape)} {weight.dtype}"
    assert weight_scale_inv.shape == (cdiv(n, FP8_BLOCK), cdiv(k, FP8_BLOCK)), \
        f"weight_scale_inv {tuple(weight_scale_inv.shape)} for weight {(n, k)}"
    assert weight_scale_inv.dtype == torch.float32 and (bias is None or bias.shape == (n,))


def fp8_weight_only_gated_gemm_ref(*, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                                   bias: torch.Tensor | None = None) -> torch.Tensor:
    """silu(gate) * up of fp8_weight_only_gemm_ref's result: weight [2I, K] with rows [gate; up] -> [M, I]."""
    gate_up = fp8_weight_only_gemm_ref(x=x, weight=weight, weight_scale_inv=weight_scale_inv, bias=bias)
    return silu_and_mul_ref(gate_up=gate_up)


def fp8_weight_only_gated_gemm(*, x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                               bias: torch.Tensor | None = None) -> torch.Tensor:
    """silu_and_mul of fp8_weight_only_gemm's result: a gated MLP's gate_up (weight [2I, K], rows [gate; up]) ->
    [M, I]. Where the GEMV serves the shape (1-2 rows; I a multiple of 128) the activation is its epilogue (one
    launch, and the [M, 2I] result is never written), rounded as the two launches round: bit for bit under one
    launch config, while configs tuned apart may sum K in another order. Otherwise the two run one after the other."""
    _check(x, weight, weight_scale_inv, bias)
    x, weight, weight_scale_inv = x.contiguous(), weight.contiguous(), weight_scale_inv.contiguous()
    m, n = x.shape[0], weight.shape[0]
    kernel = _kernel_for(x, weight, weight_scale_inv, bias) if m else None
    if kernel != "gemv" or n % 256:
        plain = torch.empty(m, n, dtype=x.dtype, device=x.device)
        if m:
            _launch(x, weight, weight_scale_inv, bias, plain, kernel)
        return silu_and_mul(gate_up=plain)
    y = torch.empty(m, n // 2, dtype=x.dtype, device=x.device)
    _launch(x, weight, weight_scale_inv, bias, y, "gemv", gated=True)
    return y


DENSE_MAX_ROWS = 16


def dense_few_rows_gemm(*, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear for 16-bit weights and up to DENSE_MAX_ROWS rows on the same tensor-core kernel,
    unscaled: x [M, K], weight [N, K] in x's dtype (float32 too: full-precision dots), bias [N] or None
    -> [M, N]. Its column tiles and K splits are tuned per shape, so it can stream a narrow weight (few
    output columns, long K) where cuBLAS's choice of tiles leaves SMs idle; dense_linear.py serves
    whichever of the two timed faster."""
    m, k = x.shape
    n = weight.shape[0]
    assert m <= DENSE_MAX_ROWS, f"{m} rows: more than {DENSE_MAX_ROWS}"
    assert weight.shape == (n, k) and weight.dtype == x.dtype and x.is_floating_point(), \
        f"weight {tuple(weight.shape)} {weight.dtype} for x {tuple(x.shape)} {x.dtype}"
    assert bias is None or bias.shape == (n,)
    x, weight = x.contiguous(), weight.contiguous()
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m:
        _launch(x, weight, None, bias, y, "dot")
    return y


def _kernel_for(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor,
                bias: torch.Tensor | None) -> str:
    """"dot" above GEMV_MAX_ROWS rows; for fewer, whichever of "gemv" and "dot" ran this shape faster
    on CUDA (fastest.py, after each kernel's own tuning, into an output of its own), "gemv" elsewhere."""
    (m, k), n = x.shape, weight.shape[0]
    if m > GEMV_MAX_ROWS:
        return "dot"
    if not x.is_cuda:
        return "gemv"
    def runs() -> dict:  # only for a shape not yet timed
        y = torch.empty(m, n, dtype=x.dtype, device=x.device)
        return {kernel: functools.partial(_launch, x, weight, weight_scale_inv, bias, y, kernel)
                for kernel in ("gemv", "dot")}

    return fastest(("fp8_weight_only", n, k, m, x.dtype, x.device), runs) or "gemv"


def _launch(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor | None, bias: torch.Tensor | None,
            y: torch.Tensor, kernel: str, f16_operands: bool | None = None, gated: bool = False) -> None:
    """Run `kernel` ("gemv" for 1-2 rows, or "dot") into y; f16_operands None: for bf16 x up to 16 rows.
    weight_scale_inv None: a 16-bit weight ("dot" only). gated ("gemv" only): y [M, N / 2] gets silu(gate) * up."""
    (m, k), n = x.shape, weight.shape[0] // (2 if gated else 1)
    scales = weight if weight_scale_inv is None else weight_scale_inv  # (16-bit weights: unread)
    args = (x, weight, scales, bias if bias is not None else y, y, m, n, k,
            x.stride(0), weight.stride(0), scales.stride(0), y.stride(0))
    if kernel == "gemv":
        flags = dict(HAS_BIAS=bias is not None, GATED=gated, ROWS=next_power_of_2(m))
        if x.is_cuda:
            _gemv_tuned[lambda meta: (cdiv(n, meta["BLOCK_N"]),)](*args, **flags)
        else:  # the interpreter: one config
            _gemv_kernel[(cdiv(n, 16),)](*args, BLOCK_N=16, BLOCK_K=256, STAGES=1, **flags)
        return
    bucket = max(16, next_power_of_2(m))  # 16, 32 or 64: one row tile reads the weight once
    # fp16 operands pay a per-tile scaling of x that grows with its rows: it pays off at 16 rows, not at 64
    f16 = x.dtype == torch.bfloat16 and bucket == 16 if f16_operands is None else f16_operands
    f16 = f16 and weight_scale_inv is not None  # (16-bit weights multiply as they are)
    flags = dict(HAS_BIAS=bias is not None, EXACT_DOT=x.dtype == torch.float32, F16_OPERANDS=f16, M_BUCKET=bucket,
                 SCALED=weight_scale_inv is not None, BLOCK_M=bucket, BLOCK_K=FP8_BLOCK)
    args = args[:5] + (parts_scratch(x.device, MAX_SPLIT_K * bucket * n),
                       arrival_counters(x.device, cdiv(n, 16))) + args[5:]
    if x.is_cuda:
        _dot_tuned[lambda meta: (cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"])](*args, **flags)
    else:  # the interpreter: one config, K split in two
        _dot_kernel[(cdiv(n, 32), 2)](*args, BLOCK_N=32, SPLIT_K=2, **flags)


MAX_SPLIT_K = 8
