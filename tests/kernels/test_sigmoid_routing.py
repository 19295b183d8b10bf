"""The sigmoid grouped top-k router kernel (Nemotron-H's MoE) vs its torch reference (interpreter on CPU,
float32)."""

import pytest
import torch

from triton_kernels.sigmoid_routing import sigmoid_topk, sigmoid_topk_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("num_experts,groups,keep_groups,top_k", [
    (16, 1, 1, 4),  # no groups (Nemotron-3 Nano's shape: 128 experts, 1 group, top 6)
    (128, 1, 1, 6),
    (32, 4, 2, 4),  # groups kept, experts from the kept ones only
    (24, 3, 2, 5),  # groups and experts per group not powers of two
    (40, 8, 3, 3),
    (12, 6, 6, 2),  # all groups kept: no masking
])
@pytest.mark.parametrize("renormalize", [False, True])
def test_matches_ref(num_experts, groups, keep_groups, top_k, renormalize):
    g = torch.Generator().manual_seed(num_experts + groups)
    logits = (2 * torch.randn(7, num_experts, generator=g)).to(DEVICE)
    bias = (0.5 * torch.randn(num_experts, generator=g)).to(DEVICE)  # negative choices too
    kw = dict(bias=bias, top_k=top_k, groups=groups, keep_groups=keep_groups, renormalize=renormalize, scale=2.5)
    weights, ids = sigmoid_topk(logits=logits, **kw)
    ref_weights, ref_ids = sigmoid_topk_ref(logits=logits, **kw)
    assert ids.dtype == torch.int64 and weights.dtype == torch.float32
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-6, atol=1e-6)


def test_group_choice_counts_two_best_experts_and_ties_go_low():
    """A group with one strong expert loses to one with two good ones; equal choices pick the lower ids."""
    logits = torch.full((1, 8), -4.0)
    logits[0, 0] = 4.0  # group 0: one strong expert
    logits[0, 4] = logits[0, 5] = 2.0  # group 1: two good ones (sum higher)
    logits[0, 6] = logits[0, 7] = 2.0
    kw = dict(bias=torch.zeros(8), top_k=2, groups=2, keep_groups=1, renormalize=False, scale=1.0)
    _, ids = sigmoid_topk(logits=logits.to(DEVICE), **{k: v.to(DEVICE) if torch.is_tensor(v) else v
                                                      for k, v in kw.items()})
    assert ids.tolist() == [[4, 5]]
    _, ref_ids = sigmoid_topk_ref(logits=logits, **kw)
    assert sorted(ref_ids[0].tolist())[0] >= 4  # the reference keeps the same group


def test_no_tokens():
    weights, ids = sigmoid_topk(logits=torch.zeros(0, 8, device=DEVICE), bias=torch.zeros(8, device=DEVICE),
                                top_k=2, groups=2, keep_groups=1, renormalize=True, scale=1.0)
    assert weights.shape == ids.shape == (0, 2)
