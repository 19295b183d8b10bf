"""Shared fixtures. On machines without CUDA, Triton kernels run in the interpreter and HF uses
its torch path (fla hidden)."""

import gc
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.modules.setdefault("fla", None)
# The oracle is HF's own torch code: transformers >= 5.25 otherwise swaps in layers from the `kernels`
# package (hub downloads) by default, and refuses to load a model where that package is missing.
os.environ.setdefault("USE_HUB_KERNELS", "0")

import pytest  # noqa: E402

from hybrid_sgl.testing.tiny_checkpoint import make_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """tiny_checkpoint(family, **config_overrides) -> path of a saved tiny HF checkpoint (built once)."""
    built: dict[tuple, str] = {}

    def get(family: str = "qwen3_5", **overrides) -> str:
        key = (family, repr(sorted(overrides.items())))
        if key not in built:
            path = str(tmp_path_factory.mktemp(family))
            built[key] = make_checkpoint(path, family, **overrides)
        return built[key]

    return get


@pytest.fixture(autouse=True)
def _gpu_memory_back(request):
    """After each CUDA test: collect what it left (schedulers and runners in reference cycles) and give the
    cached blocks back to the driver, so that pytest workers sharing one GPU plan their pools from free memory
    that finished tests no longer hold (a plan sized from too little memory shrinks the context or fails)."""
    yield
    if torch.cuda.is_available() and "gpu" in request.keywords:
        gc.collect()
        torch.cuda.empty_cache()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
