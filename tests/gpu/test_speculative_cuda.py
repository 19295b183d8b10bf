"""Speculative decoding on CUDA through the Triton kernels, float32: verify steps replay the extend
graphs with their cuts, and greedy output equals plain decoding, with the MTP layer's drafts and with
test-only drafts that are mostly right (so that rollback runs at every depth). Skipped without CUDA."""

import pytest

from hybrid_sgl.runner.speculative import SpecDecoder
from tests.gpu.test_model_cuda import BACKENDS
from tests.test_speculative import GREEDY, PROMPTS, SPEC, ScriptedDrafts, _generate

pytestmark = pytest.mark.gpu
CUDA = dict(device="cuda", **BACKENDS["triton"])


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_greedy_output_equals_plain_decoding_on_cuda(tiny_checkpoint, monkeypatch, family):
    path = tiny_checkpoint(family, mtp=True)
    plain, _ = _generate(path, PROMPTS, GREEDY, **CUDA)
    spec, _ = _generate(path, PROMPTS, GREEDY, **CUDA, **SPEC)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    truth = {tuple(prompt): o["output_ids"] for prompt, o in zip(PROMPTS, plain)}
    scripted = ScriptedDrafts(truth, 0.8, seed=3)
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))
    spec, stats = _generate(path, PROMPTS, GREEDY, **CUDA, **SPEC)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert stats["avg_spec_accept_length"] > 1.5
