"""--speculative-rollback replay on CUDA through the Triton kernels, float32 (the tiny checkpoints' GDN
layers keep their state: hybrid_sgl/testing/tiny_checkpoint.py): the verify graphs keep their inputs and
write no GDN state, the kept tokens are replayed after each verify step, and greedy output equals plain
decoding, graphed and eager alike. Skipped without CUDA."""

import pytest

from hybrid_sgl.engine import Engine
from hybrid_sgl.runner.speculative import SpecDecoder
from tests.gpu.test_model_cuda import BACKENDS
from tests.test_speculative import GREEDY, PROMPTS, ScriptedDrafts, _generate
from tests.test_speculative_replay import REPLAY

pytestmark = pytest.mark.gpu
CUDA = dict(device="cuda", **BACKENDS["triton"])


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_replayed_rollback_on_cuda_graphed_and_eager(tiny_checkpoint, monkeypatch, family):
    path = tiny_checkpoint(family, mtp=True)
    plain, _ = _generate(path, PROMPTS, GREEDY, **CUDA)
    truth = {tuple(prompt): o["output_ids"] for prompt, o in zip(PROMPTS, plain)}
    scripted = ScriptedDrafts(truth, 0.8, seed=3)
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))

    def run(**kw):
        with Engine(model_path=path, dtype="float32", log_level="warning", **CUDA, **REPLAY, **kw) as engine:
            verify = engine.runner.verify_graphs
            replays = [0]
            if verify is not None:
                assert verify.replay_recurrent
                real = verify.run
                verify.run = lambda *a, **k: (replays.__setitem__(0, replays[0] + 1), real(*a, **k))[1]
            outs = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
            engine.check_integrity()
        return outs, replays[0]

    graphed, verify_replays = run()
    eager, _ = run(disable_cuda_graph=True)
    assert verify_replays > 0
    assert [o["output_ids"] for o in graphed] == [o["output_ids"] for o in plain]
    assert [o["output_ids"] for o in eager] == [o["output_ids"] for o in plain]
