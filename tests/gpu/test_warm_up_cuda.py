"""The engine is warm when it starts serving: the first request of each prompt size takes at most 1.5x
the same request run again (prefix cache off, so both compute every token), with 30 ms of slack for the
tiny model's host-bound steps. A kernel compiled or tuned at the first request costs 100 ms or more.
Skipped without CUDA."""

import time

import pytest

from hybrid_sgl.engine import Engine
from tests.gpu.test_model_cuda import BACKENDS
from tests.test_hf_parity import prompt_of

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h"])
def test_first_request_of_each_size_is_warm(tiny_checkpoint, family):
    path = tiny_checkpoint(family)
    with Engine(model_path=path, device="cuda", dtype="float32", log_level="warning", disable_radix_cache=True,
                chunked_prefill_size=256, **BACKENDS["triton"]) as engine:
        vocab = engine.runner.config.vocab_size
        params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
        for n in (5, 37, 100, 250, 600):  # inside and past the extend graphs' sizes, one and several chunks
            ids = prompt_of(n, n, vocab)
            times = []
            for _ in range(2):
                start = time.perf_counter()
                engine.generate(input_ids=ids, sampling_params=params)
                times.append(time.perf_counter() - start)
            assert times[0] <= 1.5 * times[1] + 0.03, (n, times)


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h"])
def test_no_kernel_compiles_after_warm_up_in_multi_row_eager_steps(tiny_checkpoint, family):
    """Steps above the extend graphs (eager) with 1, 5 and 16 rows, from position 0 and from cached
    prefixes, token counts on and off multiples of 16, and a repeated prompt: the warm-up compiled every
    kernel they need (the watch saw no compile after it)."""
    path = tiny_checkpoint(family)
    with Engine(model_path=path, device="cuda", dtype="float32", log_level="warning", chunked_prefill_size=256,
                cuda_graph_max_tokens=64, **BACKENDS["triton"]) as engine:
        vocab = engine.runner.config.vocab_size
        params = {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True}
        shared = prompt_of(40, 1, vocab)
        # later rounds hit the cached prefix; the last repeats the first prompt (a one-token extend step)
        for rows, n in ((1, 251), (5, 57), (16, 16), (5, 90), (1, 251)):
            prompts = [shared + prompt_of(n, 100 * rows + i, vocab) for i in range(rows)]
            engine.generate(input_ids=prompts, sampling_params=params)
        assert engine.runner.compile_watch.after_warm_up == []
