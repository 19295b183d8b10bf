"""Engine.shutdown() gives the device back: three engines in a row in one process, each with decode and
extend CUDA graphs and prefix-cache snapshots, serve the same output, and after each shutdown the memory
the process has allocated is back where it was before the first (what stays must not grow from engine to
engine, and is far below the 1 GiB bound users were promised). Skipped without CUDA."""

import gc

import pytest
import torch

from hybrid_sgl.engine import Engine
from tests.gpu.test_model_cuda import BACKENDS
from tests.test_hf_parity import prompt_of

pytestmark = pytest.mark.gpu
MIB = 2**20


def allocated() -> int:
    torch.cuda.synchronize()
    gc.collect()
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated()


def largest_live_cuda_tensors(n: int = 6) -> list[tuple]:
    """(shape, dtype, MiB) of the n largest CUDA tensors the collector can reach: what a leak holds."""
    found = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda]
    found.sort(key=lambda t: -t.untyped_storage().nbytes())
    return [(tuple(t.shape), t.dtype, t.untyped_storage().nbytes() / MIB) for t in found[:n]]


def test_three_engines_in_a_row_give_the_device_back(tiny_checkpoint):
    path = tiny_checkpoint("qwen3_5")
    before = allocated()
    outputs, held, left = [], [], []
    for _ in range(3):
        engine = Engine(model_path=path, device="cuda", dtype="float32", log_level="warning", **BACKENDS["triton"])
        try:
            held.append(torch.cuda.memory_allocated() - before)
            ids = prompt_of(300, 3, engine.runner.config.vocab_size)
            params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
            first = engine.generate(input_ids=ids, sampling_params=params)
            again = engine.generate(input_ids=ids, sampling_params=params)  # restored from a snapshot
            assert again["meta_info"]["cached_tokens"] == len(ids) - 1, again["meta_info"]
            assert again["output_ids"] == first["output_ids"]
            assert engine.stats()["snapshots_taken"] > 0
            outputs.append(first["output_ids"])
        finally:
            engine.shutdown()
        del engine
        left.append(allocated() - before)
    assert outputs[0] == outputs[1] == outputs[2]
    assert min(held) > 64 * MIB, held  # the engine's weights, pools and graphs: the check below means something
    leak = (held, left, largest_live_cuda_tensors())
    assert max(left) < 1024 * MIB and max(left) < min(held) // 10, leak
    assert left[2] - left[0] <= 4 * MIB, leak  # nothing piles up from one engine to the next
