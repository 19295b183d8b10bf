"""Build a model on its device and fill its weights: from safetensors (tensor by tensor, single
file or sharded index) or randomly from config.json alone (`load_format="dummy"`)."""

from __future__ import annotations

import glob
import json
import logging
import os
from collections.abc import Iterator

import torch
from safetensors import safe_open
from tqdm import tqdm

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.models.registry import model_class

logger = logging.getLogger(__name__)


def checkpoint_files(path: str) -> list[str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(path, n) for n in names]
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}; use load_format='dummy' for random weights")
    return files


def iter_checkpoint(path: str, progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) one tensor at a time; only headers are read up front (for the total)."""
    files = checkpoint_files(path)
    total = 0
    for file in files:
        with safe_open(file, framework="pt") as f:
            total += len(f.keys())
    with tqdm(total=total, desc="loading weights", unit="tensor", disable=not progress) as bar:
        for file in files:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    yield name, f.get_tensor(name)
                    bar.update(1)


def build_model(config: ModelConfig, backends, *, dtype: torch.dtype, device: torch.device, max_positions: int,
                load_format: str, model_path: str, seed: int | None) -> torch.nn.Module:
    cls = model_class(config)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = cls(config, backends, max_positions)
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        if load_format == "dummy":
            init_dummy_weights(model, seed or 0)
        else:
            for p in model.parameters():
                p.fill_(float("nan"))  # anything the checkpoint does not fill stays NaN and is caught below
            model.load_weights(iter_checkpoint(model_path))
            missing = [n for n, p in model.named_parameters() if torch.isnan(p).any()]
            if missing:
                raise ValueError(f"checkpoint {model_path} did not provide: {', '.join(missing[:8])}"
                                 + (" ..." if len(missing) > 8 else ""))
    return model.eval()


def init_dummy_weights(model: torch.nn.Module, seed: int) -> None:
    """Random weights of the real shapes: small normals for matrices, neutral values for norms and
    sensible SSM parameters, so that dummy runs exercise realistic numerics."""
    generators: dict[torch.device, torch.Generator] = {}
    for name, p in model.named_parameters():
        gen = generators.setdefault(p.device, torch.Generator(device=p.device).manual_seed(seed))
        if name.endswith("A_log"):
            p.uniform_(1, 16, generator=gen).log_()
        elif name.endswith(("dt_bias", ".D")):
            p.fill_(1.0)
        elif "norm" in name:
            p.fill_(0.0 if getattr(_owner(model, name), "offset", 0.0) else 1.0)
        else:
            p.normal_(0.0, 0.02, generator=gen)


def _owner(model: torch.nn.Module, param_name: str) -> torch.nn.Module:
    return model.get_submodule(param_name.rpartition(".")[0])
