"""The softmax top-k router kernel vs its torch reference (interpreter on CPU, float32)."""

import pytest
import torch

from triton_kernels.arrival_counters import arrival_counters
from triton_kernels.moe_routing import (
    norm_route,
    norm_route_ref,
    route,
    route_ref,
    softmax_topk,
    softmax_topk_ref,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("num_tokens,num_experts,top_k", [(1, 8, 2), (5, 6, 3), (7, 60, 4), (3, 512, 10), (4, 5, 5)])
@pytest.mark.parametrize("renormalize", [False, True])
def test_matches_ref(num_tokens, num_experts, top_k, renormalize):
    """Expert counts that are not powers of two (masked lanes), k = E, Qwen3-Next's 512 / top-10."""
    logits = torch.randn(num_tokens, num_experts, generator=torch.Generator().manual_seed(num_experts)).to(DEVICE)
    weights, ids = softmax_topk(logits=logits, top_k=top_k, renormalize=renormalize)
    ref_weights, ref_ids = softmax_topk_ref(logits=logits, top_k=top_k, renormalize=renormalize)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-6, atol=1e-6)
    if renormalize:
        torch.testing.assert_close(weights.sum(-1), torch.ones(num_tokens, device=DEVICE))


def test_strided_rows_and_no_tokens():
    """Router logits with an extra column (the shared expert's gate) are read through a view."""
    wide = torch.randn(6, 9, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    logits = wide[:, :8]
    for got, ref in zip(softmax_topk(logits=logits, top_k=2, renormalize=True),
                        softmax_topk_ref(logits=logits, top_k=2, renormalize=True)):
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    weights, ids = softmax_topk(logits=wide[:0, :8], top_k=2, renormalize=False)
    assert weights.shape == (0, 2) and ids.shape == (0, 2)


def test_rejects_k_above_expert_count():
    with pytest.raises(AssertionError, match="top_k"):
        softmax_topk(logits=torch.zeros(2, 4, device=DEVICE), top_k=5, renormalize=False)


@pytest.mark.parametrize("gated", [False, True])
def test_shared_expert_slot_follows_the_routed_ones(gated):
    """A stacked shared expert: slot k holds its id and sigmoid(its gate logit, column E), or 1."""
    logits = torch.randn(5, 7, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    kw = dict(logits=logits, top_k=3, renormalize=True, num_experts=6, shared_id=6, shared_gate=gated)
    weights, ids = softmax_topk(**kw)
    ref_weights, ref_ids = softmax_topk_ref(**kw)
    assert weights.shape == ids.shape == (5, 4) and torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-6, atol=1e-6)
    assert (ids[:, 3] == 6).all() and (ids[:, :3] < 6).all()
    gate = torch.sigmoid(logits[:, 6]) if gated else torch.ones(5, device=DEVICE)
    torch.testing.assert_close(weights[:, 3], gate)
    routed, routed_ids = softmax_topk_ref(logits=logits[:, :6], top_k=3, renormalize=True)
    assert torch.equal(ids[:, :3], routed_ids)
    torch.testing.assert_close(weights[:, :3], routed, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("num_tokens,hidden,experts,top_k,shared", [
    (1, 2048, 256, 8, "gated"),  # Qwen3.5-35B-A3B at decode: one tile of H, the gate row past the experts
    (3, 100, 9, 3, None),  # H not a multiple of the tile, odd expert count
    (16, 72, 12, 4, "ungated"),  # the largest batch the kernel takes, a shared slot weighted 1
    (17, 40, 6, 2, "gated"),  # past it: cuBLAS and the top-k kernel
    (5, 64, 5, 5, None),  # k = E
])
@pytest.mark.parametrize("renormalize", [False, True])
def test_route_matches_its_reference(num_tokens, hidden, experts, top_k, shared, renormalize):
    """One launch: router rows over all tokens (bf16 x widened in the kernel), then the top-k of every
    token in the last program to arrive. Same ids as the reference, weights and logits to float32
    rounding, the counter left at 0."""
    g = torch.Generator().manual_seed(hidden + experts)
    x = torch.randn(num_tokens, hidden, generator=g).bfloat16().to(DEVICE)
    weight = torch.randn(experts + (shared == "gated"), hidden, generator=g).div(hidden ** 0.5).to(DEVICE)
    kw = dict(x=x, weight=weight, top_k=top_k, renormalize=renormalize, num_experts=experts,
              shared_id=None if shared is None else experts, shared_gate=shared == "gated")
    weights, ids, logits = route(**kw)
    ref_weights, ref_ids, ref_logits = route_ref(**kw)
    slots = top_k + (shared is not None)
    assert weights.shape == ids.shape == (num_tokens, slots) and ids.dtype == torch.int64
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-4)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-5, atol=1e-6)
    assert int(arrival_counters(x.device, 1)[0]) == 0


def test_route_breaks_ties_toward_the_lower_expert():
    """Equal logits: the lower ids win, as argmax picks them (and the routing is deterministic)."""
    x = torch.ones(2, 16).to(DEVICE)
    weight = torch.zeros(10, 16).to(DEVICE)
    weight[7] = 1.0  # expert 7 first, then experts 0 and 1 among the nine tied at 0
    weights, ids, _ = route(x=x, weight=weight, top_k=3, renormalize=False, num_experts=10)
    assert ids.tolist() == [[7, 0, 1], [7, 0, 1]]
    assert weights[:, 1].eq(weights[:, 2]).all() and (weights[:, 0] > weights[:, 1]).all()


@pytest.mark.parametrize("num_tokens,hidden,experts,top_k,shared,offset", [
    (1, 2048, 256, 8, "gated", 1.0),  # Qwen3.5-35B-A3B at decode (zero-centered norm weight)
    (3, 100, 9, 3, None, 0.0),  # H not a power of two
    (16, 72, 12, 4, "ungated", 0.0),  # the largest batch in one launch
    (17, 40, 6, 2, "gated", 1.0),  # past it: the norm kernel, then route
])
@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)])
def test_norm_route_matches_its_reference(num_tokens, hidden, experts, top_k, shared, offset, dtype):
    """The block's pre-norm (residual add, RMSNorm) inside the router's launch: the normed rows and the sum
    as add_rmsnorm_ref's (bf16: equal but for the norm's summation order), the routing as route_ref's on
    them, the counter left at 0. (bf16 on CUDA only: the interpreter rounds float32 to bf16 wrongly.)"""
    g = torch.Generator().manual_seed(hidden + experts + num_tokens)
    x = torch.randn(num_tokens, hidden, generator=g).to(DEVICE, dtype)
    residual = (3 * torch.randn(num_tokens, hidden + 5, generator=g)).to(DEVICE, dtype)[:, :hidden]  # strided rows
    norm_weight = (0.1 * torch.randn(hidden, generator=g) + 1 - offset).to(DEVICE, dtype)
    weight = torch.randn(experts + (shared == "gated"), hidden, generator=g).div(hidden ** 0.5).to(DEVICE)
    kw = dict(x=x, residual=residual, norm_weight=norm_weight, eps=1e-6, offset=offset, weight=weight, top_k=top_k,
              renormalize=True, num_experts=experts, shared_id=None if shared is None else experts,
              shared_gate=shared == "gated")
    weights, ids, logits, h, r = norm_route(**kw)
    ref_weights, ref_ids, ref_logits, ref_h, ref_r = norm_route_ref(**kw)
    assert h.dtype == r.dtype == dtype and h.shape == r.shape == (num_tokens, hidden)
    assert torch.equal(r, ref_r)
    if dtype == torch.float32:
        torch.testing.assert_close(h, ref_h, rtol=1e-5, atol=1e-5)
    else:  # at most one bf16 step apart, in few elements
        assert ((h.float() - ref_h.float()).abs() <= ref_h.float().abs() / 64).all()
        assert (h != ref_h).float().mean() < 0.01
    weights2, ids2, logits2 = route_ref(x=h, **{k: v for k, v in kw.items()
                                                if k not in ("x", "residual", "norm_weight", "eps", "offset")})
    torch.testing.assert_close(logits, logits2, rtol=1e-5, atol=1e-4)
    assert torch.equal(ids, ids2)
    torch.testing.assert_close(weights, weights2, rtol=1e-5, atol=1e-6)
    if dtype == torch.float32:
        assert torch.equal(ids, ref_ids)
    assert int(arrival_counters(x.device, 1)[0]) == 0
