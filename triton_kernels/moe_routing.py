"""Router of softmax MoEs (Qwen3-MoE / Qwen3-Next / Qwen3.5-MoE, Granite, Jamba): float32 softmax
over each token's expert logits, the k largest, optionally renormalized to sum to 1.

One program per token, in one kernel, where eager runs five (softmax, topk's two, sum, divide).
Experts are picked by k rounds of argmax, so ties go to the lower expert id.

A shared expert stacked with the routed ones (layers/moe.py) takes one more slot, k: its id is
`shared_id` and its weight sigmoid(its gate logit, the column after the experts) or 1 without a gate.
"""

import torch
import triton
import triton.language as tl


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
def _softmax_topk_kernel(logits, weights, ids, stride_l, E, shared_id, TOP_K: tl.constexpr, RENORM: tl.constexpr,
                         SLOTS: tl.constexpr, SHARED_GATE: tl.constexpr, BLOCK_E: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    """SLOTS = TOP_K, or TOP_K + 1 with the shared expert's slot last."""
    t = tl.program_id(0).to(tl.int64)
    o_e = tl.arange(0, BLOCK_E)
    m_e = o_e < E
    b_l = tl.load(logits + t * stride_l + o_e, mask=m_e, other=float("-inf")).to(tl.float32)
    b_p = tl.exp(b_l - tl.max(b_l, 0))
    b_p = b_p / tl.sum(b_p, 0)
    b_p = tl.where(m_e, b_p, -1.0)  # padding lanes are never picked
    o_k = tl.arange(0, BLOCK_K)
    b_w = tl.zeros([BLOCK_K], dtype=tl.float32)
    b_i = tl.zeros([BLOCK_K], dtype=tl.int64)
    for j in tl.static_range(TOP_K):
        i_best = tl.argmax(b_p, 0)
        b_w = tl.where(o_k == j, tl.max(b_p, 0), b_w)
        b_i = tl.where(o_k == j, i_best, b_i)
        b_p = tl.where(o_e == i_best, -1.0, b_p)
    if RENORM:
        b_w = b_w / tl.sum(b_w, 0)  # lanes past k hold 0
    if SLOTS > TOP_K:
        if SHARED_GATE:
            gate = tl.sigmoid(tl.load(logits + t * stride_l + E).to(tl.float32))
        else:
            gate = 1.0
        b_w = tl.where(o_k == TOP_K, gate, b_w)
        b_i = tl.where(o_k == TOP_K, shared_id, b_i)
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
                                   BLOCK_E=triton.next_power_of_2(e), BLOCK_K=triton.next_power_of_2(slots))
    return weights, ids


def router_logits_ref(*, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x: [T, H] (any float dtype); weight: [R, H] float32 -> logits [T, R] float32."""
    return torch.nn.functional.linear(x.float(), weight)


@triton.jit
def _router_logits_kernel(x, w, out, R, H, stride_x, stride_w, stride_o, BLOCK_R: tl.constexpr,
                          BLOCK_H: tl.constexpr):
    """Program (i_r, t): logits of BLOCK_R router rows for token t, x widened to float32 in registers."""
    i_r, t = tl.program_id(0), tl.program_id(1).to(tl.int64)
    o_r = i_r * BLOCK_R + tl.arange(0, BLOCK_R)
    o_h = tl.arange(0, BLOCK_H)
    m_r = o_r < R
    acc = tl.zeros([BLOCK_R, BLOCK_H], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        m_h = h0 + o_h < H
        b_x = tl.load(x + t * stride_x + h0 + o_h, mask=m_h, other=0.0).to(tl.float32)
        b_w = tl.load(w + o_r.to(tl.int64)[:, None] * stride_w + h0 + o_h[None, :], mask=m_r[:, None] & m_h[None, :],
                      other=0.0)
        acc += b_w * b_x[None, :]
    tl.store(out + t * stride_o + o_r, tl.sum(acc, 1), mask=m_r)


ROUTER_KERNEL_MAX_TOKENS = 16  # decode batches; more tokens go to cuBLAS, which reads the weight once


def router_logits(*, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """router_logits_ref without the float32 copy of x: up to ROUTER_KERNEL_MAX_TOKENS tokens in one
    Triton kernel (where a cast and cuBLAS's GEMV took two launches), more through the reference."""
    t, h = x.shape
    if t > ROUTER_KERNEL_MAX_TOKENS or t == 0:
        return router_logits_ref(x=x, weight=weight)
    r = weight.shape[0]
    assert weight.shape == (r, h) and weight.dtype == torch.float32 and weight.stride(-1) == 1 and x.stride(-1) == 1
    out = torch.empty((t, r), dtype=torch.float32, device=x.device)
    block_h = min(512, triton.next_power_of_2(h))
    _router_logits_kernel[(triton.cdiv(r, 4), t)](x, weight, out, r, h, x.stride(0), weight.stride(0), out.stride(0),
                                                  BLOCK_R=4, BLOCK_H=block_h)
    return out
