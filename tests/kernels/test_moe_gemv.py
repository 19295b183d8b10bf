"""The few-token expert GEMVs (triton_kernels/moe_gemv.py) against the fused MoE's torch reference
(interpreter on CPU, float32, tiny shapes; on CUDA through the tuned configs). H = 200 and I = 136 are not
multiples of the 128-wide K tiles or of the 16-column blocks, and the gated w13's up rows start inside
a scale block."""

import pytest
import torch

from triton_kernels.arrival_counters import MAX_COUNTERS, arrival_counters
from triton_kernels.fp8_quant import quantize_fp8_stacked
from triton_kernels.fused_moe import GEMV_MAX_ROWS, _fused_moe_fwd, fused_moe, fused_moe_ref
from triton_kernels.moe_gemv import expert_gemvs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H, I = 200, 136


def _problem(num_tokens: int, top_k: int, activation: str, num_experts: int = 5, seed: int = 0, inter: int = I) -> dict:
    """Experts (intermediate size `inter`), x and a softmax top-k routing of random logits (distinct experts per
    token)."""
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(num_experts, (2 if activation == "silu" else 1) * inter, H, generator=g) / H**0.5
    w13[:, :100] *= 8.0  # blocks of different magnitudes: a wrong FP8 block scale shows
    w2 = torch.randn(num_experts, H, inter, generator=g) / inter**0.5
    x = torch.randn(num_tokens, H, generator=g)
    weights, ids = torch.randn(num_tokens, num_experts, generator=g).softmax(-1).topk(top_k, dim=-1)
    return {name: v.to(DEVICE) for name, v in dict(x=x, w13=w13, w2=w2, topk_weights=weights, topk_ids=ids).items()}


def _gemvs(kw: dict, activation: str = "silu") -> torch.Tensor:
    out = _fused_moe_fwd(**kw, activation=activation, path="gemv")
    assert int(arrival_counters(kw["x"].device, MAX_COUNTERS).count_nonzero()) == 0, "a counter was left raised"
    return out


@pytest.mark.parametrize("num_tokens,top_k", [(1, 1), (1, 3), (3, 2), (12, 3)])  # 12 x 3: experts repeat
@pytest.mark.parametrize("activation", ["silu", "relu2"])
def test_matches_reference(num_tokens, top_k, activation):
    kw = _problem(num_tokens, top_k, activation, seed=num_tokens * 10 + top_k)
    out = _gemvs(kw, activation)
    assert out.shape == kw["x"].shape and out.dtype == kw["x"].dtype
    ref = fused_moe_ref(**kw, activation=activation)
    atol = 1e-5 * ref.abs().max().item()  # relu2 of the 8x blocks: outputs in the hundreds, float32 sums
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=atol)
    torch.testing.assert_close(out, fused_moe(**kw, activation=activation), rtol=1e-5, atol=atol)


@pytest.mark.parametrize("gated", [False, True])
def test_shared_expert_slots_held_elsewhere_and_strided_x(gated):
    """A gated (or plain) shared expert joins the slot sum; a slot routed to another rank's expert (id E)
    adds nothing; x is a column slice of a wider tensor; the same call twice on the same counters."""
    kw = _problem(3, 2, "silu", seed=21)
    g = torch.Generator().manual_seed(22)
    wide = torch.randn(3, H + 9, generator=g).to(DEVICE)
    kw["x"] = wide[:, :H]
    kw["topk_ids"][1, 0] = kw["w2"].shape[0]
    kw.update(shared=torch.randn(3, H, generator=g).to(DEVICE), partial=True,
              shared_gate=torch.randn(3, generator=g).to(DEVICE) if gated else None)
    ref = fused_moe_ref(**kw)
    for _ in range(2):
        torch.testing.assert_close(_gemvs(kw), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation,inter", [("silu", I), ("relu2", I), ("silu", 160)])
def test_fp8_experts_match_their_dequantized_reference(activation, inter):
    """e4m3 experts with 128 x 128 block scales against the reference on the dequantized weights; a
    wrong scale of one block of w2 and of w13's up rows shows. Gated w13's up rows start at row `inter`:
    136 (not a multiple of 32) takes the per-row scales, 160 the block scale of each program's rows."""
    kw = _problem(2, 2, activation, seed=31, inter=inter)
    for w in ("w13", "w2"):
        kw[w], kw[w + "_scale"] = quantize_fp8_stacked(kw[w].cpu())
    kw = {name: v.to(DEVICE) for name, v in kw.items()}
    ref = fused_moe_ref(**kw, activation=activation)
    scale = ref.abs().max().item()
    torch.testing.assert_close(_gemvs(kw, activation), ref, rtol=1e-4, atol=1e-5 * scale)
    for name, block in [("w2_scale", (slice(None), 1, 0)), ("w13_scale", (slice(None), 1, 1))]:
        wrong = kw[name].clone()
        wrong[block] *= 2.0  # w2: output rows 128.., inner columns 0..127; w13: rows 128.. (up rows when gated)
        assert not torch.allclose(_gemvs({**kw, name: wrong}, activation), ref, rtol=1e-4, atol=1e-5 * scale)


def test_expert_gemvs_direct_call_without_shared_expert():
    """The module's entry point as fused_moe.py calls it: weights contiguous float32, no scales."""
    kw = _problem(2, 3, "silu", seed=41)
    out = expert_gemvs(kw["x"], kw["w13"], kw["w2"], None, None, kw["topk_weights"].float().contiguous(),
                       kw["topk_ids"], True, None, None)
    torch.testing.assert_close(out, fused_moe_ref(**kw), rtol=1e-5, atol=1e-5)


def test_gemv_path_refuses_many_rows():
    kw = _problem(GEMV_MAX_ROWS + 1, 1, "silu", seed=51)
    with pytest.raises(AssertionError, match="gemv path"):
        _fused_moe_fwd(**kw, activation="silu", path="gemv")
