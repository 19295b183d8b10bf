"""The softmax top-k router kernel vs its torch reference (interpreter on CPU, float32)."""

import pytest
import torch

from triton_kernels.moe_routing import softmax_topk, softmax_topk_ref

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
