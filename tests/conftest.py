"""Shared fixtures. On machines without CUDA, Triton kernels run in the interpreter and HF uses
its torch path (fla hidden)."""

import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.modules.setdefault("fla", None)

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


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
