"""Fused MoE on CUDA at real expert shapes in bf16, against the torch reference in float32 (our
error must stay about that of the bf16 reference), in float32 (tf32x3 dots) at a tight
tolerance, and replayed from a CUDA graph with new inputs. Skipped without CUDA."""

import pytest
import torch

from triton_kernels.fp8_quant import quantize_fp8_stacked
from triton_kernels.fused_moe import GEMV_MAX_ROWS, _fused_moe_fwd, fused_moe, fused_moe_ref

pytestmark = pytest.mark.gpu

# (experts, top_k, hidden, expert intermediate, activation)
SHAPES = {
    "qwen3_5_35b_a3b": (256, 8, 2048, 512, "silu"),
    "qwen3_next_80b_a3b": (512, 10, 2048, 512, "silu"),
    "nemotron_h_relu2": (128, 6, 2688, 1856, "relu2"),  # I not a multiple of 128
}


def _problem(shape: str, num_tokens: int, dtype: torch.dtype, seed: int = 0) -> dict:
    e, k, h, i, activation = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(seed)
    rows = (2 if activation == "silu" else 1) * i
    w13 = (torch.randn(e, rows, h, generator=g, device="cuda") / h**0.5).to(dtype)
    w2 = (torch.randn(e, h, i, generator=g, device="cuda") / i**0.5).to(dtype)
    x = torch.randn(num_tokens, h, generator=g, device="cuda").to(dtype)
    probs = torch.randn(num_tokens, e, generator=g, device="cuda").softmax(dim=-1)
    weights, ids = probs.topk(k, dim=-1)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return dict(x=x, w13=w13, w2=w2, topk_weights=weights, topk_ids=ids, activation=activation)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _float32(kw: dict) -> dict:
    return {name: t.float() if torch.is_tensor(t) and t.is_floating_point() else t for name, t in kw.items()}


@pytest.mark.parametrize("num_tokens", [1, 32, 256, 4096])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_bf16_real_shapes(shape, num_tokens):
    kw = _problem(shape, num_tokens, torch.bfloat16, seed=num_tokens)
    out = fused_moe(**kw)
    assert out.shape == kw["x"].shape and out.dtype == torch.bfloat16
    exact = fused_moe_ref(**_float32(kw))
    ref_err = _rel_err(fused_moe_ref(**kw), exact)  # bf16 rounding of the reference's own steps
    err = _rel_err(out, exact)
    assert err < 1e-2 and err <= 1.5 * ref_err + 1e-3, f"ours {err:.2e} vs bf16 reference {ref_err:.2e}"
    worst = (out.float() - exact).abs().max().item()
    assert worst <= 0.05 * exact.abs().max().item(), f"max abs error {worst:.3e}"


@pytest.mark.parametrize("num_tokens", [1, 4])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_few_token_paths_at_real_shapes(shape, num_tokens):
    """Both paths the served call chooses between for a few tokens (tensor-core "dot", expert GEMVs),
    bf16 against the float32 reference as above; then FP8 experts against the dequantized reference."""
    kw = _problem(shape, num_tokens, torch.bfloat16, seed=num_tokens + 40)
    if num_tokens * kw["topk_ids"].shape[1] > GEMV_MAX_ROWS:
        pytest.skip("more assignments than the gemv path takes")
    exact = fused_moe_ref(**_float32(kw))
    ref_err = _rel_err(fused_moe_ref(**kw), exact)
    for path in ("dot", "gemv"):
        err = _rel_err(_fused_moe_fwd(**kw, path=path), exact)
        assert err < 1e-2 and err <= 1.5 * ref_err + 1e-3, f"{path}: {err:.2e} vs bf16 reference {ref_err:.2e}"
    for w in ("w13", "w2"):
        kw[w], kw[w + "_scale"] = quantize_fp8_stacked(kw[w])
    exact = fused_moe_ref(**{**_float32(kw), "w13": kw["w13"], "w2": kw["w2"]})  # e4m3 dequantized to float32
    for path in ("dot", "gemv"):
        err = _rel_err(_fused_moe_fwd(**kw, path=path), exact)
        assert err < 1e-2, f"FP8 {path}: {err:.2e}"


@pytest.mark.parametrize("num_tokens", [5, 300])
def test_float32_tight(num_tokens):
    kw = _problem("qwen3_5_35b_a3b", num_tokens, torch.float32, seed=7)
    torch.testing.assert_close(fused_moe(**kw), fused_moe_ref(**kw), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("num_tokens,path", [(1, None), (24, None), (1, "gemv"), (4, "gemv")])
def test_cuda_graph_replay_with_new_inputs(num_tokens, path):
    """Captured once, replayed with new x, weights and routing (spread, then every token on the
    same k experts): the grids are sized for any routing and nothing syncs with the host."""
    static = _problem("qwen3_5_35b_a3b", num_tokens, torch.bfloat16, seed=1)
    _fused_moe_fwd(**static, path=path)  # compile (and tune) outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _fused_moe_fwd(**static, path=path)
    k = static["topk_ids"].shape[1]
    for seed, skewed in ((2, False), (3, True)):
        new = _problem("qwen3_5_35b_a3b", num_tokens, torch.bfloat16, seed=seed)
        if skewed:
            new["topk_ids"] = torch.arange(k, device="cuda").expand(num_tokens, k).contiguous()
        for name in ("x", "topk_weights", "topk_ids"):
            static[name].copy_(new[name])
        graph.replay()
        exact = fused_moe_ref(**_float32(static))
        assert _rel_err(out, exact) < 1e-2, f"replay {seed}: {_rel_err(out, exact):.2e}"
