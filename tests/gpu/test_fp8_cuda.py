"""FP8 checkpoints on CUDA: the tiny FP8 checkpoint of tests/test_fp8_checkpoint.py through the Triton
FP8 GEMM (autotuned, e4m3 x e4m3 tensor cores) and the Triton kernels with decode CUDA graphs, against
the same checkpoint on CPU through the reference GEMM, float32 activations: within the spread of one
e4m3 rounding (Hopper's FP8 MMA sums a tile's products in reduced precision, which flips activation
roundings downstream). Skipped without CUDA."""

import pytest
import torch

from hybrid_sgl.engine import Engine
from tests.gpu.test_model_cuda import BACKENDS
from tests.test_fp8_checkpoint import PROMPTS, fp8_checkpoint  # noqa: F401 (fixture)

pytestmark = pytest.mark.gpu


def _prompt_logprobs(path: str, **args) -> torch.Tensor:
    greedy = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    with Engine(model_path=path, dtype="float32", page_size=16, max_running_requests=4, log_level="warning",
                **args) as engine:
        outs = engine.generate(input_ids=PROMPTS, sampling_params=greedy, return_logprob=True, logprob_start_len=0)
        if args["device"] == "cuda":
            assert engine.run_on_engine(lambda s: s.runner.graphs is not None)
    return torch.cat([torch.tensor([lp for lp, *_ in o["meta_info"]["input_token_logprobs"] if lp is not None])
                      for o in outs])


@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_cuda_fp8_matches_the_cpu_reference(fp8_checkpoint, quantization):  # noqa: F811
    """An FP8 checkpoint, and --quantization fp8 on top of it (the same weights re-blocked)."""
    ours = _prompt_logprobs(fp8_checkpoint, device="cuda", quantization=quantization, **BACKENDS["triton"])
    ref = _prompt_logprobs(fp8_checkpoint, device="cpu", quantization=quantization)
    # this random 128-wide model's logprobs move by a few percent when any activation's e4m3
    # rounding flips (tests/test_fp8_checkpoint.py), and reduced-precision FP8 MMA sums flip some
    rel = (ours - ref).abs() / ref.abs()
    assert rel.max() < 0.15 and rel.mean() < 0.05, (rel.max(), rel.mean())


def test_cuda_fp8_experts_match_the_cpu_reference(tiny_checkpoint, tmp_path):
    """--enable-fp8-experts on a Qwen3.5-MoE FP8 checkpoint: the fused MoE's FP8 kernels against the
    CPU reference on the same e4m3 experts."""
    from tools.fp8_checkpoint import convert

    path = convert(tiny_checkpoint("qwen3_5_moe"), str(tmp_path / "fp8"), experts=True)
    ours = _prompt_logprobs(path, device="cuda", enable_fp8_experts=True, **BACKENDS["triton"])
    ref = _prompt_logprobs(path, device="cpu", enable_fp8_experts=True)
    rel = (ours - ref).abs() / ref.abs()
    assert rel.max() < 0.15 and rel.mean() < 0.05, (rel.max(), rel.mean())
