"""The tiny composed hybrid on CUDA against its reference (float32, CPU): the torch references and
the Triton kernels with decode CUDA graphs (padded batch sizes) over the packed state pool, and bf16
close to the float32 reference. Skipped without CUDA."""

import pytest
import torch

from hybrid_sgl.testing.tiny_composed import make_composed_checkpoint
from tests.gpu.test_model_cuda import BACKENDS, run_staggered_float32
from tests.test_composed_parity import check_against_reference, reference_logprobs
from tests.test_hf_parity import dense, full_request, make_scheduler, prompt_of, run_to_end

pytestmark = pytest.mark.gpu



@pytest.fixture(scope="module")
def composed(tmp_path_factory) -> str:
    return make_composed_checkpoint(str(tmp_path_factory.mktemp("composed_gpu")))


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_cuda_float32_matches_reference(composed, backend):
    reqs, vocab = run_staggered_float32(composed, backend)
    for req in reqs:
        check_against_reference(composed, req, vocab)


def test_cuda_bfloat16_triton_close_to_reference(composed):
    """bf16 weights and activations, fp32 state: total variation per position against the float32
    reference stays small."""
    s = make_scheduler(composed, device="cuda", dtype="bfloat16", chunked_prefill_size=32, **BACKENDS["triton"])
    vocab = s.vocab_size
    req = full_request("b", prompt_of(100, 3, vocab), vocab, max_new=8)
    run_to_end(s, {0: [req]})
    ref = reference_logprobs(composed, req.prompt_ids + req.output_ids)
    ours = dense(req.input_top_logprobs[1:] + req.output_top_logprobs, vocab)
    tv = (ours.exp() - ref.exp()).abs().sum(-1) / 2
    assert torch.isfinite(ours).all()
    assert tv.mean() < 0.03 and tv.max() < 0.15, (tv.mean(), tv.max())
