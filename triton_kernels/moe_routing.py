"""Router of softmax MoEs (Qwen3-MoE / Qwen3-Next / Qwen3.5-MoE, Granite, Jamba): float32 softmax
over each token's expert logits, the k largest, optionally renormalized to sum to 1.

One program per token, in one kernel, where eager runs five (softmax, topk's two, sum, divide).
Experts are picked by k rounds of argmax, so ties go to the lower expert id.

Decode batches (up to 16 tokens) route in one kernel, `route`: the router GEMV and then, in the last
program to finish its rows, the top-k of every token. Larger batches run the router through cuBLAS and
the top-k kernel.

A shared expert stacked with the routed ones (layers/moe.py) takes one more slot, k: its id is
`shared_id` and its weight sigmoid(its gate logit, the column after the experts) or 1 without a gate.

`norm_route` also takes the block's pre-norm: the residual add and RMSNorm (norms.add_rmsnorm) run
inside the same launch, each program normalizing the few token rows it needs and the first writing
them out for the experts, which saves the norm's launch at decode.
"""

import torch
import triton
import triton.language as tl

from triton_kernels.arrival_counters import arrival_counters
from triton_kernels.cached_launch import cached_launch
from triton_kernels.host_math import cdiv, next_power_of_2
from triton_kernels.norms import add_rmsnorm, add_rmsnorm_ref, rmsnorm_tile


def softmax_topk_ref(*, logits: torch.Tensor, top_k: int, renormalize: bool, num_experts: int | None = None,
                     shared_id: int | None = None, shared_gate: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [T, E] or [T, E + 1] with the shared expert's gate logit last (any float dtype, rows may be
    strided); num_experts E (None: every column). Returns (weights [T, k] float32, ids [T, k] int64), or
    [T, k + 1] with the shared expert's slot last when shared_id is given."""
    e = logits.shape[1] if num_experts is None else num_experts
    weights, ids = logits[:, :e].float().softmax(dim=-1).topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if shared_id is None:
        return weights, ids
    t = logits.shape[0]
    gate = torch.sigmoid(logits[:, e].float()) if shared_gate else torch.ones(t, device=logits.device)
    return (torch.cat([weights, gate[:, None]], dim=1),
            torch.cat([ids, torch.full((t, 1), shared_id, dtype=ids.dtype, device=ids.device)], dim=1))


@triton.jit
def _topk_slots(b_l, b_gate, m_e, shared_id, TOP_K: tl.constexpr, RENORM: tl.constexpr, SLOTS: tl.constexpr,
                SHARED_GATE: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    """b_l [BLOCK_T, BLOCK_E] float32 logits of BLOCK_T tokens (finite in every row; lanes ~m_e unused);
    b_gate [BLOCK_T] the shared gate's logits (SHARED_GATE) -> (weights [BLOCK_T, BLOCK_K] float32, ids
    [BLOCK_T, BLOCK_K] int64): the softmax's TOP_K largest, renormalized if RENORM, then the shared slot
    at TOP_K when SLOTS > TOP_K. Picked by TOP_K rounds of one max over a key per lane: the probability's
    float32 bits (positive, so ordered as integers) above BLOCK_E - 1 - expert id, so ties go to the
    lower id as argmax's do."""
    o_e = tl.arange(0, BLOCK_E)
    b_l = tl.where(m_e[None, :], b_l, float("-inf"))
    b_p = tl.exp(b_l - tl.max(b_l, 1)[:, None])
    b_p = b_p / tl.sum(b_p, 1)[:, None]
    key = (b_p.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (BLOCK_E - 1 - o_e)[None, :]
    key = tl.where(m_e[None, :], key, -1)  # padding lanes are never picked
    o_k = tl.arange(0, BLOCK_K)
    b_wt = tl.zeros([b_l.shape[0], BLOCK_K], dtype=tl.float32)
    b_id = tl.zeros([b_l.shape[0], BLOCK_K], dtype=tl.int64)
    for j in tl.static_range(TOP_K):
        best = tl.max(key, 1)
        b_wt = tl.where(o_k[None, :] == j, (best >> 32).to(tl.int32).to(tl.float32, bitcast=True)[:, None], b_wt)
        b_id = tl.where(o_k[None, :] == j, (BLOCK_E - 1 - (best & 0xFFFFFFFF))[:, None], b_id)
        key = tl.where(key == best[:, None], -1, key)
    if RENORM:
        b_wt = b_wt / tl.sum(b_wt, 1)[:, None]  # lanes past k hold 0
    if SLOTS > TOP_K:
        if SHARED_GATE:
            gate = tl.sigmoid(b_gate)
        else:
            gate = tl.full(b_gate.shape, 1.0, tl.float32)
        b_wt = tl.where(o_k[None, :] == TOP_K, gate[:, None], b_wt)
        b_id = tl.where(o_k[None, :] == TOP_K, shared_id, b_id)
    return b_wt, b_id


@cached_launch
@triton.jit
def _softmax_topk_kernel(logits, weights, ids, stride_l, E, shared_id, TOP_K: tl.constexpr, RENORM: tl.constexpr,
                         SLOTS: tl.constexpr, SHARED_GATE: tl.constexpr, BLOCK_E: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    """Program t: token t's row as a [1, BLOCK_E] tile through _topk_slots. SLOTS = TOP_K, or TOP_K + 1
    with the shared expert's slot last."""
    t = tl.program_id(0).to(tl.int64)
    o_e = tl.arange(0, BLOCK_E)
    m_e = o_e < E
    b_l = tl.load(logits + t * stride_l + o_e, mask=m_e, other=0.0).to(tl.float32)[None, :]
    if SHARED_GATE:  # [1]
        b_gate = tl.load(logits + t * stride_l + E + tl.zeros([1], dtype=tl.int32)).to(tl.float32)
    else:
        b_gate = tl.zeros([1], dtype=tl.float32)
    b_w, b_i = _topk_slots(b_l, b_gate, m_e, shared_id, TOP_K, RENORM, SLOTS, SHARED_GATE, BLOCK_E, BLOCK_K)
    o_k = tl.arange(0, BLOCK_K)[None, :]
    tl.store(weights + t * SLOTS + o_k, b_w, mask=o_k < SLOTS)
    tl.store(ids + t * SLOTS + o_k, b_i, mask=o_k < SLOTS)


def softmax_topk(*, logits: torch.Tensor, top_k: int, renormalize: bool, num_experts: int | None = None,
                 shared_id: int | None = None, shared_gate: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax_topk_ref in one Triton kernel (same arguments and results); no host sync."""
    t = logits.shape[0]
    e = logits.shape[1] if num_experts is None else num_experts
    assert logits.stride(-1) == 1, f"logits need a unit last stride, got strides {logits.stride()}"
    assert 0 < top_k <= e, f"top_k={top_k} must be in [1, {e}]"
    assert not shared_gate or (shared_id is not None and logits.shape[1] > e), "the shared gate is column E"
    slots = top_k + (shared_id is not None)
    weights = torch.empty((t, slots), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, slots), dtype=torch.int64, device=logits.device)
    if t:
        _softmax_topk_kernel[(t,)](logits, weights, ids, logits.stride(0), e, shared_id or 0, TOP_K=top_k,
                                   RENORM=renormalize, SLOTS=slots, SHARED_GATE=shared_gate,
                                   BLOCK_E=next_power_of_2(e), BLOCK_K=next_power_of_2(slots))
    return weights, ids


def router_logits_ref(*, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x: [T, H] (any float dtype); weight: [R, H] float32 -> logits [T, R] float32."""
    return torch.nn.functional.linear(x.float(), weight)


ROUTER_KERNEL_MAX_TOKENS = 16  # decode batches; more tokens go to cuBLAS, which reads the weight once


def route_ref(*, x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool, num_experts: int,
              shared_id: int | None = None, shared_gate: bool = False
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x: [T, H]; weight: [R, H] float32, its first num_experts rows the experts' (R = E, or E + 1 with a
    shared expert's gate row). Returns (weights [T, slots] float32, ids [T, slots] int64, logits [T, R]
    float32), slots as softmax_topk_ref's."""
    logits = router_logits_ref(x=x, weight=weight)
    weights, ids = softmax_topk_ref(logits=logits, top_k=top_k, renormalize=renormalize, num_experts=num_experts,
                                    shared_id=shared_id, shared_gate=shared_gate)
    return weights, ids, logits


@triton.jit
def _add_rmsnorm_row(x, res, nw, h_out, r_out, t, stride_x, stride_res, H, eps, offset, write, o_h, m_h):
    """Token t's normalized row [BLOCK_H >= H] as float32, as norms._rmsnorm_kernel computes it: r = x + res
    rounded to x's dtype, h = norms.rmsnorm_tile(r) rounded too. `write`: store h and r (rows of H)."""
    b_r = tl.load(x + t * stride_x + o_h, mask=m_h, other=0.0).to(tl.float32)
    b_r = (b_r + tl.load(res + t * stride_res + o_h, mask=m_h, other=0.0).to(tl.float32)).to(x.dtype.element_ty)
    b_h = rmsnorm_tile(b_r.to(tl.float32), tl.load(nw + o_h, mask=m_h, other=0.0), H, eps, offset)
    b_h = b_h.to(x.dtype.element_ty)
    if write:
        tl.store(r_out + t * H + o_h, b_r, mask=m_h)
        tl.store(h_out + t * H + o_h, b_h, mask=m_h)
    return b_h.to(tl.float32)


@cached_launch
@triton.jit
def _route_kernel(x, w, logits, weights, ids, arrivals, res, nw, h_out, r_out, T, R, H, E, shared_id, stride_x,
                  stride_w, stride_res, eps, offset, TOP_K: tl.constexpr, RENORM: tl.constexpr, SLOTS: tl.constexpr,
                  SHARED_GATE: tl.constexpr, NORM: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr,
                  BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program i_r: logits [T, BLOCK_R rows] (each weight tile read once for all T tokens). The last
    program to arrive takes the softmax and top-k of all T tokens at once, [BLOCK_T, BLOCK_E]
    (_topk_slots). NORM (BLOCK_H >= H): x is the delta to add to res, and the router reads the normed
    rows (_add_rmsnorm_row), which program 0 writes to h_out and r_out."""
    i_r = tl.program_id(0)
    o_r = i_r * BLOCK_R + tl.arange(0, BLOCK_R)
    o_t = tl.arange(0, BLOCK_T)
    o_h = tl.arange(0, BLOCK_H)
    m_r = o_r < R
    acc = tl.zeros([BLOCK_R, BLOCK_T], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        m_h = h0 + o_h < H
        b_w = tl.load(w + o_r.to(tl.int64)[:, None] * stride_w + h0 + o_h[None, :], mask=m_r[:, None] & m_h[None, :],
                      other=0.0)
        for t in range(T):
            if NORM:
                b_x = _add_rmsnorm_row(x, res, nw, h_out, r_out, t, stride_x, stride_res, H, eps, offset, i_r == 0,
                                       o_h, m_h)
            else:
                b_x = tl.load(x + t * stride_x + h0 + o_h, mask=m_h, other=0.0).to(tl.float32)
            part = tl.sum(b_w * b_x[None, :], 1)
            acc = tl.where(o_t[None, :] == t, acc + part[:, None], acc)
    m_t = o_t < T
    tl.store(logits + o_t[None, :] * R + o_r[:, None], acc, mask=m_r[:, None] & m_t[None, :])
    tl.debug_barrier()  # every thread's logits are written before the count says so
    if tl.atomic_add(arrivals, 1, sem="acq_rel") == tl.num_programs(0) - 1:  # every program's rows are in
        o_e = tl.arange(0, BLOCK_E)
        m_e = o_e < E
        b_l = tl.load(logits + o_t[:, None] * R + o_e[None, :], mask=m_t[:, None] & m_e[None, :], other=0.0,
                      cache_modifier=".cg")
        if SHARED_GATE:
            b_gate = tl.load(logits + o_t * R + E, mask=m_t, other=0.0, cache_modifier=".cg")
        else:
            b_gate = tl.zeros([BLOCK_T], dtype=tl.float32)
        b_wt, b_id = _topk_slots(b_l, b_gate, m_e, shared_id, TOP_K, RENORM, SLOTS, SHARED_GATE, BLOCK_E, BLOCK_K)
        o_k = tl.arange(0, BLOCK_K)
        m_out = m_t[:, None] & (o_k < SLOTS)[None, :]
        tl.store(weights + o_t[:, None] * SLOTS + o_k[None, :], b_wt, mask=m_out)
        tl.store(ids + o_t[:, None] * SLOTS + o_k[None, :], b_id, mask=m_out)
        tl.atomic_xchg(arrivals, 0)


ROUTE_CONFIG = dict(BLOCK_R=2, BLOCK_H=2048, num_warps=4)


def route_config(num_tokens: int, norm_hidden: int | None = None) -> dict:
    """The launch config for a batch: at 8 tokens and more, 8 router rows per program (faster there at
    256 and 512 experts; at one token BLOCK_R makes no difference).
    norm_hidden (the pre-norm fused: whole rows of H in a tile): past H = 2048, 2 rows per program, which
    sm_90 holds without spilling (tests/kernels/test_moe_sm90_compile.py)."""
    c = {**ROUTE_CONFIG, "BLOCK_R": 8} if num_tokens >= 8 else dict(ROUTE_CONFIG)
    if norm_hidden:
        c["BLOCK_H"] = next_power_of_2(norm_hidden)
        c["BLOCK_R"] = c["BLOCK_R"] if c["BLOCK_H"] <= 2048 else 2
    return c


def route(*, x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool, num_experts: int,
          shared_id: int | None = None, shared_gate: bool = False, config: dict | None = None
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """route_ref (same arguments and results): up to ROUTER_KERNEL_MAX_TOKENS tokens in one launch, more
    through cuBLAS and the top-k kernel. config: BLOCK_R, BLOCK_H (at most), num_warps (benchmarks vary
    it; default route_config(T))."""
    t = x.shape[0]
    if t > ROUTER_KERNEL_MAX_TOKENS or t == 0:
        logits = router_logits_ref(x=x, weight=weight)
        return *softmax_topk(logits=logits, top_k=top_k, renormalize=renormalize, num_experts=num_experts,
                             shared_id=shared_id, shared_gate=shared_gate), logits
    return _route_launch(x=x, weight=weight, top_k=top_k, renormalize=renormalize, num_experts=num_experts,
                         shared_id=shared_id, shared_gate=shared_gate, config=config)


def _route_launch(*, x: torch.Tensor, weight: torch.Tensor, top_k: int, renormalize: bool, num_experts: int,
                  shared_id: int | None = None, shared_gate: bool = False, config: dict | None = None,
                  norm: dict | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One _route_kernel launch for 1 to ROUTER_KERNEL_MAX_TOKENS tokens, arguments as route's. norm
    (norm_route's): residual, norm_weight, eps, offset, and the outputs h and r it fills."""
    t, h = x.shape
    r, e = weight.shape[0], num_experts
    assert weight.shape == (r, h) and weight.dtype == torch.float32 and weight.stride(-1) == 1 and x.stride(-1) == 1
    assert 0 < top_k <= e <= r, f"top_k={top_k} must be in [1, {e}] and {e} experts at most the {r} router rows"
    assert not shared_gate or (shared_id is not None and r > e), "the shared gate is row E of the router"
    slots = top_k + (shared_id is not None)
    logits = torch.empty((t, r), dtype=torch.float32, device=x.device)
    weights = torch.empty((t, slots), dtype=torch.float32, device=x.device)
    ids = torch.empty((t, slots), dtype=torch.int64, device=x.device)
    norm = norm or {}
    c = {**route_config(t, h if norm else None), **(config or {})}
    block_h = c["BLOCK_H"] if norm else min(c["BLOCK_H"], next_power_of_2(h))
    assert block_h >= h or not norm, f"the pre-norm needs whole rows: BLOCK_H {block_h} < H {h}"
    res = norm.get("residual", x)
    _route_kernel[(cdiv(r, c["BLOCK_R"]),)](
        x, weight, logits, weights, ids, arrival_counters(x.device, 1), res, norm.get("norm_weight", x),
        norm.get("h", x), norm.get("r", x), t, r, h, e, shared_id or 0, x.stride(0), weight.stride(0), res.stride(0),
        norm.get("eps", 0.0), norm.get("offset", 0.0), TOP_K=top_k, RENORM=renormalize, SLOTS=slots,
        SHARED_GATE=shared_gate, NORM=bool(norm), BLOCK_R=c["BLOCK_R"], BLOCK_H=block_h,
        BLOCK_T=next_power_of_2(t), BLOCK_E=next_power_of_2(e), BLOCK_K=next_power_of_2(slots),
        num_warps=c["num_warps"])
    return weights, ids, logits


NORM_ROUTE_MAX_HIDDEN = 4096  # each program holds whole token rows


def norm_route_ref(*, x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                   offset: float = 0.0, **route_kw) -> tuple[torch.Tensor, ...]:
    """The block's pre-norm, then route_ref: x (the delta), residual: [T, H]; norm_weight: [H]; route_kw as
    route_ref's. Returns (weights, ids, logits) as route_ref's, then h = rmsnorm(x + residual) and
    x + residual, [T, H] in x's dtype."""
    h, r = add_rmsnorm_ref(x=x, residual=residual, weight=norm_weight, eps=eps, offset=offset)
    return (*route_ref(x=h, **route_kw), h, r)


def norm_route(*, x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
               offset: float = 0.0, **route_kw) -> tuple[torch.Tensor, ...]:
    """norm_route_ref (same arguments and results). Decode batches (1 to ROUTER_KERNEL_MAX_TOKENS tokens,
    H up to NORM_ROUTE_MAX_HIDDEN) in one launch; others through norms.add_rmsnorm, then route."""
    t, h = x.shape
    assert residual.shape == x.shape and residual.dtype == x.dtype and norm_weight.shape == (h,), \
        f"residual {tuple(residual.shape)} {residual.dtype}, norm weight {tuple(norm_weight.shape)}, x {tuple(x.shape)}"
    if not 0 < t <= ROUTER_KERNEL_MAX_TOKENS or h > NORM_ROUTE_MAX_HIDDEN or residual.stride(-1) != 1:
        hn, r = add_rmsnorm(x=x, residual=residual, weight=norm_weight, eps=eps, offset=offset)
        return (*route(x=hn, **route_kw), hn, r)
    hn, r = torch.empty((t, h), dtype=x.dtype, device=x.device), torch.empty((t, h), dtype=x.dtype, device=x.device)
    norm = dict(residual=residual, norm_weight=norm_weight, eps=eps, offset=offset, h=hn, r=r)
    return (*_route_launch(x=x, **route_kw, norm=norm), hn, r)
