"""Tensor parallelism on CPU (gloo): --tp-size 2 and 4 give the greedy tokens of tp 1 and logprobs
within 1e-4 for each family that splits, through chunked prefill, a batch that preempts, input
logprobs and prefix-cache hits; configs that do not split are refused with their counts (a rank
that dies: test_tensor_parallel_server.py).

The cases cover every split: Qwen3.5 (GDN, gated attention, dense MLP), Qwen3.5-MoE at tp 4 (KV
heads replicated, MoE experts and shared expert), Qwen3-Next (its shared expert stacked with the
experts), Nemotron-H (Mamba2 groups split, relu2 MLP,
sigmoid-routed MoE), Bamba with one Mamba2 group (replicated: the gated norm spans both ranks),
Falcon-H1 (parallel attention + Mamba2 with folded multipliers), Jamba (Mamba-1 channels, MoE), and
the composed hybrid (every mixer kind, packed state slots). Overlapped decode steps too, whose input
tokens reach the other ranks by a broadcast from rank 0's device."""

import pytest
import torch

from hybrid_sgl.engine import Engine
from hybrid_sgl.server_args import ServerArgs
from hybrid_sgl.testing.tiny_checkpoint import TINY_MOE
from hybrid_sgl.testing.tiny_composed import make_composed_checkpoint

# 7 pages of 16 tokens for 4 requests of ~70 tokens each: the batch preempts; chunks of 24 tokens
ARGS = dict(device="cpu", dtype="float32", page_size=16, max_running_requests=4, chunked_prefill_size=24,
            max_total_tokens=112, snapshot_interval=32, log_level="warning")
TP4_GDN = dict(linear_num_key_heads=4, linear_num_value_heads=8)  # KV heads (2) replicate at tp 4


def _ids(seed: int, n: int) -> list[int]:
    return torch.randint(3, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _scenario(engine: Engine) -> dict:
    greedy = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    batch = engine.generate(input_ids=[_ids(i, 45 + 3 * i) for i in range(4)], sampling_params=greedy,
                            return_logprob=True, logprob_start_len=30)
    system = _ids(10, 40)
    first = engine.generate(input_ids=system + _ids(11, 9), sampling_params=greedy, return_logprob=True)
    second = engine.generate(input_ids=system + _ids(12, 7), sampling_params=greedy, return_logprob=True)
    # no logprobs: overlapped decode, whose steps take the previous step's ids on the device (a broadcast)
    overlapped = engine.generate(input_ids=[_ids(20 + i, 30 + i) for i in range(3)], sampling_params=greedy)
    engine.check_integrity()
    return {"outputs": [*batch, first, second], "overlapped": [o["output_ids"] for o in overlapped],
            "overlapped_steps": engine.run_on_engine(lambda s: s.pipeline.num_overlapped_steps),
            "preemptions": engine.run_on_engine(lambda s: s.num_preemptions)}


def _logprobs(out: dict) -> list[float]:
    meta = out["meta_info"]
    return [lp for lp, *_ in meta["input_token_logprobs"] + meta["output_token_logprobs"] if lp is not None]


def _run(path: str, tp: int) -> dict:
    with Engine(model_path=path, tp_size=tp, **ARGS) as engine:
        return _scenario(engine)


def _assert_same(tp1: dict, tpn: dict) -> None:
    assert tp1["preemptions"] > 0 and tpn["preemptions"] == tp1["preemptions"]
    for a, b in zip(tp1["outputs"], tpn["outputs"], strict=True):
        assert b["output_ids"] == a["output_ids"]
        assert b["meta_info"]["cached_tokens"] == a["meta_info"]["cached_tokens"]
        torch.testing.assert_close(torch.tensor(_logprobs(b)), torch.tensor(_logprobs(a)), rtol=0, atol=1e-4)
    assert tp1["outputs"][-1]["meta_info"]["cached_tokens"] >= 32  # the second prompt hit the cache
    assert tpn["overlapped_steps"] > 0 and tpn["overlapped"] == tp1["overlapped"]


CASES = [("qwen3_5", 2, {}), ("qwen3_5_moe", 4, TP4_GDN), ("nemotron_h", 2, {}), ("bamba", 2, dict(mamba_n_groups=1)),
         ("falcon_h1", 2, {}), ("jamba", 2, {}),
         ("qwen3_next", 2, dict(shared_expert_intermediate_size=TINY_MOE["moe_intermediate_size"]))]


@pytest.mark.parametrize("family, tp, dims", CASES, ids=[f"{f}-tp{tp}" for f, tp, _ in CASES])
def test_matches_tp1(tiny_checkpoint, family, tp, dims):
    path = tiny_checkpoint(family, **dims)
    _assert_same(_run(path, 1), _run(path, tp))


@pytest.mark.parametrize("family, dims, tp, message", [
    ("qwen3_5", {}, 3, "num_attention_heads is 4, which does not split over --tp-size 3"),
    ("qwen3_5", {}, 4, "linear_num_key_heads is 2, which does not split over --tp-size 4"),
    ("qwen3_5", dict(num_key_value_heads=4, num_attention_heads=8), 8, "linear_num_key_heads is 2"),
    ("bamba", dict(mamba_n_heads=2), 4, "mamba num_heads is 2, which does not split over --tp-size 4"),
    ("qwen3_5_moe", dict(moe_intermediate_size=30), 4, "moe_intermediate_size is 30, which does not split over "
                                                       "--tp-size 4"),
])
def test_configs_that_do_not_split_are_refused(tiny_checkpoint, family, dims, tp, message):
    path = tiny_checkpoint(family, **dims)
    with pytest.raises(ValueError) as e:
        ServerArgs(model_path=path, device="cpu", tp_size=tp).resolved()
    assert message in str(e.value) and "--tp-size" in str(e.value)


def test_composed_hybrid_matches_tp1(tmp_path):
    """Every mixer kind in one model (packed state slots, per rank) and MoE; a count it cannot split is refused."""
    path = make_composed_checkpoint(str(tmp_path / "composed"))
    _assert_same(_run(path, 1), _run(path, 2))
    with pytest.raises(ValueError, match="which does not split over --tp-size 3"):
        ServerArgs(model_path=path, device="cpu", tp_size=3).resolved()
