"""Shared fixtures. On machines without CUDA, Triton kernels run in the interpreter and HF uses
its torch path (fla hidden)."""

import math
import os
import shutil
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
sys.modules.setdefault("fla", None)

import pytest  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

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


@pytest.fixture
def remembering(tiny_checkpoint, tmp_path):
    """remembering(family) -> a copy of the tiny MTP checkpoint whose GDN layers keep their state. HF initializes
    A up to 16, so the decay exp(-A softplus(.)) of the tiny checkpoints is near zero and a wrong state hardly
    shows in their tokens; here every layer's A is 0.02 (decay ~0.99 a token)."""

    def get(family: str) -> str:
        out = tmp_path / f"{family}_remembering"
        shutil.copytree(tiny_checkpoint(family, mtp=True), out)
        for f in Path(out).glob("*.safetensors"):
            tensors = load_file(f)
            logs = [name for name in tensors if name.endswith("A_log")]
            assert logs, f"no A_log in {f.name}"
            for name in logs:
                tensors[name] = torch.full_like(tensors[name], math.log(0.02))
            save_file(tensors, f, metadata={"format": "pt"})
        return str(out)

    return get
