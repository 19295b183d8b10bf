"""Fused MoE kernels vs the torch reference (interpreter on CPU, float32, tiny shapes; the H200
shapes in bf16 are in tests/gpu/test_fused_moe_cuda.py). Block sizes are 16 in the interpreter, so
H = 40 and I = 24 leave partial tiles, and 17 tokens on one expert fill more than one row block."""

import pytest
import torch

from triton_kernels.fused_moe import (
    UNSORTED_MAX_ROWS,
    _fused_moe_fwd,
    _gemm_configs,
    fused_moe,
    fused_moe_ref,
)
from triton_kernels.moe_sort import sort_by_expert

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H, I = 40, 24


def _experts(num_experts: int, activation: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    rows = (2 if activation == "silu" else 1) * I
    w13 = torch.randn(num_experts, rows, H, generator=g) / H**0.5
    w2 = torch.randn(num_experts, H, I, generator=g) / I**0.5
    return w13.to(DEVICE), w2.to(DEVICE)


def _routing(num_tokens: int, num_experts: int, top_k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax top-k of random logits, as the router makes them: (weights [T, k] float32, ids [T, k])."""
    g = torch.Generator().manual_seed(seed)
    probs = torch.randn(num_tokens, num_experts, generator=g).softmax(dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    return weights.to(DEVICE), ids.to(DEVICE)


def _check(x, w13, w2, weights, ids, activation):
    kw = dict(x=x, w13=w13, w2=w2, topk_weights=weights, topk_ids=ids, activation=activation)
    out = fused_moe(**kw)
    assert out.shape == x.shape and out.dtype == x.dtype
    torch.testing.assert_close(out, fused_moe_ref(**kw), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_tokens,top_k", [(1, 1), (1, 3), (3, 2), (17, 1), (17, 3)])
@pytest.mark.parametrize("activation", ["silu", "relu2"])
def test_matches_reference(num_tokens, top_k, activation):
    num_experts = 6  # not a power of two; with few tokens most experts get none
    w13, w2 = _experts(num_experts, activation, seed=num_tokens)
    weights, ids = _routing(num_tokens, num_experts, top_k, seed=num_tokens + top_k)
    x = torch.randn(num_tokens, H, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    _check(x, w13, w2, weights, ids, activation)


@pytest.mark.parametrize("num_tokens,top_k", [(1, 4), (4, 8), (UNSORTED_MAX_ROWS, 1)])
@pytest.mark.parametrize("activation", ["silu", "relu2"])
def test_few_tokens_take_the_unsorted_path_and_agree_with_the_sorted_one(num_tokens, top_k, activation):
    """Up to UNSORTED_MAX_ROWS assignments skip the sort (a row block per assignment); tokens sharing experts
    (4 x 8 slots over 6 experts) still get each expert's rows. Both paths match the reference."""
    num_experts = 6 if top_k < 8 else 9
    w13, w2 = _experts(num_experts, activation, seed=7)
    weights, ids = _routing(num_tokens, num_experts, top_k, seed=8)
    x = torch.randn(num_tokens, H, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    assert num_tokens * top_k <= UNSORTED_MAX_ROWS
    _check(x, w13, w2, weights, ids, activation)
    up, down = _gemm_configs(num_tokens * top_k, num_experts, x.dtype, x.device)
    sorted_path = _fused_moe_fwd(x, w13, w2, weights, ids, activation, up_config=up, down_config=down)
    torch.testing.assert_close(fused_moe(x=x, w13=w13, w2=w2, topk_weights=weights, topk_ids=ids,
                                         activation=activation), sorted_path, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ["silu", "relu2"])
def test_all_tokens_on_one_expert(activation):
    """17 rows on one expert span two 16-row blocks; the other experts get no rows."""
    num_experts, num_tokens = 5, 17
    w13, w2 = _experts(num_experts, activation, seed=3)
    x = torch.randn(num_tokens, H, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    weights = torch.rand(num_tokens, 1, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    _check(x, w13, w2, weights, torch.full((num_tokens, 1), 3, device=DEVICE), activation)
    # both slots of every token on the last expert: 34 rows, each token twice
    weights2 = torch.rand(num_tokens, 2, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    _check(x, w13, w2, weights2, torch.full((num_tokens, 2), num_experts - 1, device=DEVICE), activation)


def test_skewed_routing_with_empty_experts_and_strided_x():
    """Experts 0, 2, 3, 6 get nothing; x is a column slice of a wider tensor (row stride > H)."""
    num_experts, num_tokens = 7, 17
    w13, w2 = _experts(num_experts, "silu", seed=6)
    wide = torch.randn(num_tokens, H + 9, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    g = torch.Generator().manual_seed(8)
    ids = torch.tensor([1, 4, 5], device=DEVICE)[torch.stack([torch.randperm(3, generator=g)[:2]
                                                             for _ in range(num_tokens)])]
    weights = torch.rand(num_tokens, 2, generator=g).to(DEVICE)
    _check(wide[:, :H], w13, w2, weights, ids, "silu")


def test_no_tokens_and_bad_arguments():
    w13, w2 = _experts(4, "silu")
    empty = fused_moe(x=torch.zeros(0, H, device=DEVICE), w13=w13, w2=w2,
                      topk_weights=torch.zeros(0, 2, device=DEVICE),
                      topk_ids=torch.zeros(0, 2, dtype=torch.long, device=DEVICE))
    assert empty.shape == (0, H)
    weights, ids = _routing(3, 4, 2)
    x = torch.randn(3, H, device=DEVICE)
    with pytest.raises(ValueError, match="activation"):
        fused_moe(x=x, w13=w13, w2=w2, topk_weights=weights, topk_ids=ids, activation="gelu")
    with pytest.raises(AssertionError, match="relu2 experts need"):  # gated w13 passed as non-gated
        fused_moe(x=x, w13=w13, w2=w2, topk_weights=weights, topk_ids=ids, activation="relu2")


@pytest.mark.parametrize("num_assign,num_experts,chunk", [(1, 3, 16), (51, 6, 16), (51, 6, 64), (300, 37, 32)])
def test_sort_by_expert(num_assign, num_experts, chunk):
    """Expert-sorted assignment order equals a stable sort, in one chunk or several; offsets are
    the cumulated per-expert counts (experts without assignments included)."""
    g = torch.Generator().manual_seed(num_assign)
    ids = torch.randint(0, max(1, num_experts - 2), (num_assign, 1), generator=g).to(DEVICE)  # the last two: empty
    sorted_assign, offsets = sort_by_expert(topk_ids=ids, num_experts=num_experts, chunk=chunk)
    assert torch.equal(sorted_assign.long(), torch.sort(ids.flatten(), stable=True).indices)
    counts = torch.bincount(ids.flatten(), minlength=num_experts)
    assert torch.equal(offsets.long(), torch.cat([counts.new_zeros(1), counts.cumsum(0)]))


def test_up_and_down_with_different_block_rows():
    """Each GEMM finds its blocks from the expert offsets alone, so their BLOCK_M may differ."""
    from triton_kernels.fused_moe import _fused_moe_fwd

    w13, w2 = _experts(5, "silu", seed=9)
    weights, ids = _routing(17, 5, 2, seed=10)
    x = torch.randn(17, H, generator=torch.Generator().manual_seed(11)).to(DEVICE)
    up = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=32, num_warps=4, num_stages=1)
    down = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=16, num_warps=4, num_stages=1)
    out = _fused_moe_fwd(x, w13, w2, weights, ids, "silu", up_config=up, down_config=down)
    ref = fused_moe_ref(x=x, w13=w13, w2=w2, topk_weights=weights, topk_ids=ids)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_tokens", [5, 17])  # the down kernel sums the slots (unsorted), or the combine
@pytest.mark.parametrize("top_k", [1, 3])
@pytest.mark.parametrize("gated", [False, True])
def test_shared_expert_summed_in_the_combine(num_tokens, top_k, gated):
    """The shared expert's output (scaled by sigmoid of its gate logit, or not) joins the k expert
    rows in one sum; the gate logits may be a strided column of the router's logits."""
    num_experts = 6
    w13, w2 = _experts(num_experts, "silu", seed=7)
    weights, ids = _routing(num_tokens, num_experts, top_k, seed=8)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(num_tokens, H, generator=g).to(DEVICE)
    shared = torch.randn(num_tokens, H, generator=g).to(DEVICE)
    logits = torch.randn(num_tokens, num_experts + 1, generator=g).to(DEVICE)
    kw = dict(x=x, w13=w13, w2=w2, topk_weights=weights, topk_ids=ids, shared=shared,
              shared_gate=logits[:, num_experts] if gated else None)
    out = fused_moe(**kw)
    torch.testing.assert_close(out, fused_moe_ref(**kw), rtol=1e-5, atol=1e-5)
    plain = fused_moe_ref(**{**kw, "shared": None, "shared_gate": None})
    scale = torch.sigmoid(logits[:, num_experts])[:, None] if gated else 1.0
    torch.testing.assert_close(out, plain + scale * shared, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_bf16_combine_rounds_where_eager_rounds():
    """bf16: the combine kernel rounds the experts' sum, the gate, the gated shared output and the
    total to bf16 as the eager model does, bit for bit (Qwen3-Next: k 10, H 2048). On the H200 the
    gated rows differed by one ulp until the kernel was compiled without FMA contraction
    (bench/combine_probe.py, bench/results/2026-12-01c/call2)."""
    from triton_kernels.fused_moe import _combine

    g = torch.Generator(device=DEVICE).manual_seed(11)
    t, k, h = 33, 10, 2048
    rows = torch.randn(t * k, h, device=DEVICE, generator=g).bfloat16()
    shared = torch.randn(t, h, device=DEVICE, generator=g).bfloat16()
    logits = torch.randn(t, 513, device=DEVICE, generator=g)
    gate = logits[:, 512]
    experts = rows.view(t, k, h).float()
    total = experts[:, 0]
    for j in range(1, k):  # the kernel's order of float32 additions
        total = total + experts[:, j]
    assert torch.equal(_combine(rows, t, k, None, None), total.bfloat16())
    assert torch.equal(_combine(rows, t, k, shared, None), total.bfloat16() + shared)
    expected = total.bfloat16() + torch.sigmoid(gate.bfloat16())[:, None] * shared
    assert torch.equal(_combine(rows, t, k, shared, gate), expected)


@pytest.mark.parametrize("num_tokens,top_k", [(2, 2), (40, 2)])  # the unsorted path, then the sorted one
@pytest.mark.parametrize("activation", ["silu", "relu2"])
def test_fp8_experts_match_their_dequantized_reference(num_tokens, top_k, activation):
    """FP8 experts: e4m3 weights with 128 x 128 block scales (H 160 and I 136 leave partial blocks, and
    the gated w13's up rows start inside a block), against the reference on the dequantized weights;
    a wrong block's scale shows."""
    from triton_kernels.fp8_quant import quantize_fp8_stacked

    h, i, num_experts = 160, 136, 4
    g = torch.Generator().manual_seed(12)
    w13 = torch.randn(num_experts, (2 if activation == "silu" else 1) * i, h, generator=g) / h**0.5
    w13[:, :100] *= 20.0  # blocks of different magnitudes
    w2 = torch.randn(num_experts, h, i, generator=g) / i**0.5
    (q13, s13), (q2, s2) = quantize_fp8_stacked(w13), quantize_fp8_stacked(w2)
    assert s13.shape == (num_experts, -(-w13.shape[1] // 128), 2) and s2.shape == (num_experts, 2, 2)
    weights, ids = _routing(num_tokens, num_experts, top_k, seed=13)
    x = torch.randn(num_tokens, h, generator=g).to(DEVICE)
    kw = dict(x=x, w13=q13.to(DEVICE), w2=q2.to(DEVICE), topk_weights=weights, topk_ids=ids, activation=activation,
              w13_scale=s13.to(DEVICE), w2_scale=s2.to(DEVICE))
    ref = fused_moe_ref(**kw)
    scale = ref.abs().max().item()  # relu2 of the 20x blocks makes outputs in the thousands
    torch.testing.assert_close(fused_moe(**kw), ref, rtol=1e-4, atol=1e-5 * scale)
    dequantized = fused_moe_ref(**{**kw, "w13": w13.to(DEVICE), "w2": w2.to(DEVICE), "w13_scale": None,
                                   "w2_scale": None})
    assert not torch.allclose(ref, dequantized, rtol=1e-4, atol=1e-5 * scale)  # the e4m3 rounding is really there
    torch.testing.assert_close(ref, dequantized, rtol=0.1, atol=0.1 * scale)
    wrong = s2.clone()
    wrong[:, 1, 0] *= 2.0  # output rows 128..159, inner columns 0..127
    assert not torch.allclose(fused_moe(**{**kw, "w2_scale": wrong.to(DEVICE)}), ref, rtol=1e-4, atol=1e-5 * scale)
