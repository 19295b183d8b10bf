"""Engines over a random-weight tiny model, with and without the overlap scheduler: every
constrained output must be valid whatever tokens the model prefers."""

import pytest

from hybrid_sgl import Engine


@pytest.fixture(scope="module", params=["overlap", "no-overlap"])
def engine(request, tiny_checkpoint):
    eng = Engine(model_path=tiny_checkpoint("qwen3_5"), dtype="float32", device="cpu", chunked_prefill_size=32,
                 max_running_requests=16, log_level="warning", disable_overlap_schedule=request.param != "overlap")
    yield eng
    eng.check_integrity()
    eng.shutdown()
