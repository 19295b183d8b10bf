"""Expert parallelism on CPU (gloo): --ep-size equal to --tp-size deals each MoE block's routed experts
out whole (E / size per rank) and gives the greedy tokens of tp 1 and logprobs within 1e-4, through
the scenario of test_tensor_parallel.py (chunked prefill, a batch that preempts, input logprobs,
prefix-cache hits). The fused MoE kernels skip the slots routed to another rank's experts. Models
and counts that cannot be dealt out are refused, with the reason."""

import pytest
import torch

from hybrid_sgl.engine import Engine
from hybrid_sgl.server_args import ServerArgs
from tests.test_tensor_parallel import ARGS, TP4_GDN, _assert_same, _run, _scenario
from triton_kernels.fused_moe import fused_moe, fused_moe_ref


def _run_ep(path: str, size: int) -> dict:
    with Engine(model_path=path, tp_size=size, ep_size=size, **ARGS) as engine:
        experts = engine.run_on_engine(lambda s: [m.w13.shape[0] for m in s.runner.model.modules()
                                                  if hasattr(m, "first_expert")])
        assert experts and all(n == 4 // size for n in experts)  # 4 experts in every tiny family
        return _scenario(engine)


@pytest.mark.parametrize("family, size, dims", [("qwen3_5_moe", 2, {}), ("qwen3_5_moe", 4, TP4_GDN),
                                                ("jamba", 2, {}), ("granitemoehybrid", 2, {})],
                         ids=["qwen3_5_moe-ep2", "qwen3_5_moe-ep4", "jamba-ep2", "granite-ep2"])
def test_matches_tp1(tiny_checkpoint, family, size, dims):
    path = tiny_checkpoint(family, **dims)
    _assert_same(_run(path, 1), _run_ep(path, size))


@pytest.mark.parametrize("family, dims, tp, ep, message", [
    ("qwen3_5_moe", {}, 2, 3, "--ep-size 3 with --tp-size 2"),
    ("qwen3_5", {}, 2, 2, "has no MoE layers"),
    ("nemotron_h", {}, 2, 2, "softmax-routed"),
    ("qwen3_5_moe", dict(num_experts=6), 4, 4, "num_experts 6 is not a multiple of 4"),
])
def test_what_cannot_be_dealt_out_is_refused(tiny_checkpoint, family, dims, tp, ep, message):
    dims = {**TP4_GDN, **dims} if tp == 4 else dims
    with pytest.raises(ValueError, match=message):
        ServerArgs(model_path=tiny_checkpoint(family, **dims), device="cpu", tp_size=tp, ep_size=ep).resolved()


@pytest.mark.parametrize("num_tokens", [2, 9])  # the unsorted path (2 x 3 slots) and the sorted one (27)
def test_fused_moe_skips_slots_of_other_ranks(num_tokens):
    """Ids equal to E (experts held elsewhere) add nothing: the result is the reference over the
    other slots, with and without a shared expert."""
    g = torch.Generator().manual_seed(3)
    e, h, i, k = 3, 40, 24, 3
    x = torch.randn(num_tokens, h, generator=g)
    w13, w2 = torch.randn(e, 2 * i, h, generator=g) / h**0.5, torch.randn(e, h, i, generator=g) / i**0.5
    weights = torch.rand(num_tokens, k, generator=g)
    ids = torch.randint(0, e + 1, (num_tokens, k), generator=g)  # e: another rank's
    ids[0] = e  # a token with no local expert at all
    shared = torch.randn(num_tokens, h, generator=g)
    kept = torch.where(ids < e, weights, 0.0)
    for extra in ({}, {"shared": shared}):
        expected = fused_moe_ref(x=x, w13=w13, w2=w2, topk_weights=kept, topk_ids=ids.clamp(max=e - 1), **extra)
        for op in (fused_moe, fused_moe_ref):
            got = op(x=x, w13=w13, w2=w2, topk_weights=weights, topk_ids=ids, partial=True, **extra)
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
