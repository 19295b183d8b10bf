"""Tensor parallelism on CUDA (NCCL): the scenario of tests/test_tensor_parallel.py (chunked
prefill, a batch that preempts, input logprobs, prefix-cache hits) at --tp-size 2 against tp 1 on
the same machine, every family, through the Triton kernels; tp 1 with and without decode CUDA
graphs; --ep-size 2 for the softmax-routed MoE families. Skipped without two GPUs."""

import pytest
import torch

from hybrid_sgl.engine import Engine
from tests.test_tensor_parallel import ARGS, CASES, _assert_same, _scenario

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")]
CUDA = {**ARGS, "device": "cuda", "attention_backend": "triton", "linear_attn_backend": "triton",
        "moe_runner_backend": "triton", "cuda_graph_max_bs": 8}


def _run(path: str, tp: int, graphs: bool, ep: int = 1) -> dict:
    with Engine(model_path=path, tp_size=tp, ep_size=ep, disable_cuda_graph=not graphs, **CUDA) as engine:
        return _scenario(engine)


@pytest.mark.parametrize("family, tp, dims", [c for c in CASES if c[1] == 2], ids=lambda c: str(c))
def test_tp2_matches_tp1_on_cuda(tiny_checkpoint, family, tp, dims):
    path = tiny_checkpoint(family, **dims)
    tp1_graphs, tp1_eager = _run(path, 1, True), _run(path, 1, False)
    _assert_same(tp1_eager, tp1_graphs)
    _assert_same(tp1_graphs, _run(path, tp, True))


@pytest.mark.parametrize("family", ["qwen3_5_moe", "jamba"])
def test_ep2_matches_tp1_on_cuda(tiny_checkpoint, family):
    path = tiny_checkpoint(family)
    _assert_same(_run(path, 1, True), _run(path, 2, True, ep=2))


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h"])
def test_tp2_cuda_graphs_match_tp1(tiny_checkpoint, family, monkeypatch):
    """HYBRID_SGL_TP_CUDA_GRAPH=1: every rank captures decode and extend graphs (all-reduces inside) and
    replays the shape rank 0 replays; overlapped decode steps take their ids by a broadcast."""
    from hybrid_sgl.runner import model_runner

    monkeypatch.setenv("HYBRID_SGL_TP_CUDA_GRAPH", "1")  # the spawned ranks read it at import
    monkeypatch.setattr(model_runner, "TP_CUDA_GRAPHS", True)
    path = tiny_checkpoint(family)
    tp1 = _run(path, 1, True)
    with Engine(model_path=path, tp_size=2, disable_cuda_graph=False, **CUDA) as engine:
        assert engine.run_on_engine(lambda s: s.runner.graphs is not None and s.runner.extend_graphs is not None)
        _assert_same(tp1, _scenario(engine))
