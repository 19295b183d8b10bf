"""Router of sigmoid MoEs with a score-correction bias and expert groups (Nemotron-H's MoE blocks):

    scores = sigmoid(logits)                        [T, E] float32
    choice = scores + bias                          the bias only steers the choice
    groups: a group scores the sum of its two best choices; all but the best `keep_groups` of
            `groups` groups are masked out (groups == keep_groups: no masking)
    ids = the top_k largest choices; weights = scores[ids], optionally renormalized, times `scale`

One program per token, in one kernel, where eager runs ten to twenty (sigmoid, add, the group top-k's,
scatter, masked fill, top-k, gather, sum, divide, multiply). Experts are picked by rounds of argmax, so
ties go to the lower expert id (and the lower group id).
"""

import torch
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.host_math import next_power_of_2


def sigmoid_topk_ref(*, logits: torch.Tensor, bias: torch.Tensor, top_k: int, groups: int, keep_groups: int,
                     renormalize: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [T, E] float32; bias: [E] float32. Returns (weights [T, top_k] float32, ids [T, top_k] int64)."""
    scores = logits.sigmoid()
    choice = scores + bias
    if keep_groups < groups:
        grouped = choice.view(logits.shape[0], groups, -1)  # [T, G, E/G]
        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)  # [T, G]
        kept = group_scores.topk(keep_groups, dim=-1).indices
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
        choice = choice.masked_fill(~keep.repeat_interleave(grouped.shape[-1], dim=1), float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * scale, ids


@cached_launch
@triton.jit
def _sigmoid_topk_kernel(logits, bias, weights, ids, stride_l, PER_GROUP, scale, TOP_K: tl.constexpr,
                         GROUPS: tl.constexpr, KEEP_GROUPS: tl.constexpr, RENORM: tl.constexpr,
                         BLOCK_G: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_K: tl.constexpr):
    """Program t: token t's E = GROUPS * PER_GROUP logits as a [BLOCK_G groups, BLOCK_J experts] tile."""
    t = tl.program_id(0).to(tl.int64)
    o_g = tl.arange(0, BLOCK_G)
    o_j = tl.arange(0, BLOCK_J)
    m = (o_g[:, None] < GROUPS) & (o_j[None, :] < PER_GROUP)
    o_e = tl.where(m, o_g[:, None] * PER_GROUP + o_j[None, :], -1)  # expert ids; -1 on padding lanes
    b_s = tl.sigmoid(tl.load(logits + t * stride_l + o_e, mask=m, other=0.0).to(tl.float32))
    b_c = tl.where(m, b_s + tl.load(bias + o_e, mask=m, other=0.0), float("-inf"))
    if KEEP_GROUPS < GROUPS:
        top1 = tl.max(b_c, 1)
        first = tl.min(tl.where(b_c == top1[:, None], o_j[None, :], BLOCK_J), 1)  # one of the best, not all
        top2 = tl.max(tl.where(o_j[None, :] == first[:, None], float("-inf"), b_c), 1)
        b_gs = tl.where(o_g < GROUPS, top1 + top2, float("-inf"))
        keep = o_g < 0
        for _ in tl.static_range(KEEP_GROUPS):
            g = tl.min(tl.where(b_gs == tl.max(b_gs, 0), o_g, BLOCK_G), 0)
            keep = keep | (o_g == g)
            b_gs = tl.where(o_g == g, float("-inf"), b_gs)
        b_c = tl.where(keep[:, None], b_c, float("-inf"))
    o_k = tl.arange(0, BLOCK_K)
    b_w = tl.zeros([BLOCK_K], dtype=tl.float32)
    b_i = tl.zeros([BLOCK_K], dtype=tl.int64)
    for j in tl.static_range(TOP_K):
        best = tl.max(tl.max(b_c, 1), 0)
        e = tl.min(tl.min(tl.where(b_c == best, o_e, BLOCK_G * BLOCK_J), 1), 0)
        b_w = tl.where(o_k == j, tl.sum(tl.sum(tl.where(o_e == e, b_s, 0.0), 1), 0), b_w)
        b_i = tl.where(o_k == j, e.to(tl.int64), b_i)
        b_c = tl.where(o_e == e, float("-inf"), b_c)
    if RENORM:
        b_w = b_w / (tl.sum(b_w, 0) + 1e-20)  # lanes past TOP_K hold 0
    tl.store(weights + t * TOP_K + o_k, b_w * scale, mask=o_k < TOP_K)
    tl.store(ids + t * TOP_K + o_k, b_i, mask=o_k < TOP_K)


def sigmoid_topk(*, logits: torch.Tensor, bias: torch.Tensor, top_k: int, groups: int, keep_groups: int,
                 renormalize: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """sigmoid_topk_ref in one Triton kernel (same arguments and results); no host sync."""
    t, e = logits.shape
    assert logits.stride(-1) == 1 and bias.shape == (e,), f"logits {tuple(logits.shape)}, bias {tuple(bias.shape)}"
    assert e % groups == 0 and 0 < keep_groups <= groups, f"{e} experts, {groups} groups, keep {keep_groups}"
    assert 0 < top_k <= e // groups * keep_groups, f"top_k={top_k} from {keep_groups} groups of {e // groups}"
    weights = torch.empty((t, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((t, top_k), dtype=torch.int64, device=logits.device)
    if t:
        _sigmoid_topk_kernel[(t,)](logits, bias, weights, ids, logits.stride(0), e // groups, scale, TOP_K=top_k,
                                   GROUPS=groups, KEEP_GROUPS=keep_groups, RENORM=renormalize,
                                   BLOCK_G=next_power_of_2(groups), BLOCK_J=next_power_of_2(e // groups),
                                   BLOCK_K=next_power_of_2(top_k))
    return weights, ids
