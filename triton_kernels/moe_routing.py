"""Router of softmax MoEs (Qwen3-MoE / Qwen3-Next / Qwen3.5-MoE, Granite, Jamba): float32 softmax
over each token's expert logits, the k largest, optionally renormalized to sum to 1.

One program per token, in one kernel, where eager runs five (softmax, topk's two, sum, divide).
Experts are picked by k rounds of argmax, so ties go to the lower expert id.
"""

import torch
import triton
import triton.language as tl


def softmax_topk_ref(*, logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [T, E] (any float dtype, rows may be strided) -> (weights [T, k] float32, ids [T, k] int64)."""
    weights, ids = logits.float().softmax(dim=-1).topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


@triton.jit
def _softmax_topk_kernel(logits, weights, ids, stride_l, E, TOP_K: tl.constexpr, RENORM: tl.constexpr,
                         BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr):
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
    tl.store(weights + t * TOP_K + o_k, b_w, mask=o_k < TOP_K)
    tl.store(ids + t * TOP_K + o_k, b_i, mask=o_k < TOP_K)


def softmax_topk(*, logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax_topk_ref in one Triton kernel (same arguments and results); no host sync."""
    t, e = logits.shape
    assert logits.stride(-1) == 1, f"logits need a unit last stride, got strides {logits.stride()}"
    assert 0 < top_k <= e, f"top_k={top_k} must be in [1, {e}]"
    weights = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int64, device=logits.device)
    if t:
        _softmax_topk_kernel[(t,)](logits, weights, ids, logits.stride(0), e, TOP_K=top_k, RENORM=renormalize,
                                   BLOCK_E=triton.next_power_of_2(e), BLOCK_K=triton.next_power_of_2(top_k))
    return weights, ids
