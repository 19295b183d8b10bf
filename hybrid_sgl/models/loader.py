"""Build a model on its device and fill its weights: from safetensors (tensor by tensor, single
file or sharded index) or randomly from config.json alone (`load_format="dummy"`)."""

from __future__ import annotations

import glob
import json
import logging
import os
import sys
from collections.abc import Iterator

import torch
from safetensors import safe_open
from tqdm import tqdm

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.layers.quantization import Fp8Config, dequantized_weights, quantize_experts, quantize_linears
from hybrid_sgl.memory.memory_plan import available_ram_bytes
from hybrid_sgl.models.registry import model_class

logger = logging.getLogger(__name__)


def checkpoint_files(path: str) -> list[str]:
    """The safetensors files of a checkpoint; raises, naming --load-format dummy, when there are none."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        missing = [n for n in names if not os.path.exists(os.path.join(path, n))]
        if missing:
            raise FileNotFoundError(f"{index} lists {len(missing)} shard(s) missing from {path} ({missing[0]}, ...): "
                                    "finish the download, or pass --load-format dummy for random weights")
        return [os.path.join(path, n) for n in names]
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no weights (*.safetensors) in {path}: add them, or pass --load-format dummy for "
                                "random weights of the real shapes")
    return files


def iter_checkpoint(path: str, progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) one tensor at a time; only headers are read up front (for the total).
    Progress: a bar on a terminal, a log line every ~10% otherwise (a log file gets no bar)."""
    files = checkpoint_files(path)
    total = 0
    for file in files:
        with safe_open(file, framework="pt") as f:
            total += len(f.keys())
    on_tty = progress and sys.stderr.isatty()
    step = max(total // 10, 1)
    with tqdm(total=total, desc="loading weights", unit="tensor", disable=not on_tty) as bar:
        done = 0
        for file in files:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    yield name, f.get_tensor(name)
                    bar.update(1)
                    done += 1
                    if progress and not on_tty and (done % step == 0 or done == total):
                        logger.info("loading weights: %d/%d tensors (%d%%)", done, total, 100 * done // total)


def build_model(config: ModelConfig, backends, *, dtype: torch.dtype, device: torch.device, max_positions: int,
                load_format: str, model_path: str, seed: int | None,
                quantization: Fp8Config | None = None) -> torch.nn.Module:
    """quantization: FP8 weights from the checkpoint (its FP8 tensors are dequantized on the way in and the
    linear layers they fill re-quantized), or every linear layer quantized at load; None: as stored."""
    cls = model_class(config)
    num_params, num_bytes = _size_on_meta(cls, config, backends, dtype, max_positions)
    available = available_bytes(device)
    dtype_name = str(dtype).removeprefix("torch.")
    logger.info("model %s: %s parameters, %.2f GiB in %s on %s (%.1f GiB available)", config.architecture,
                f"{num_params:,}", num_bytes / 2**30, dtype_name, describe_device(device), available / 2**30)
    if num_bytes > available:
        smaller = " --dtype bfloat16 (half the bytes)," if dtype == torch.float32 else ""
        raise ValueError(f"the weights need {num_bytes / 2**30:.1f} GiB in {dtype_name} but {describe_device(device)} "
                         f"has {available / 2**30:.1f} GiB available: use{smaller} a smaller model, or free memory")
    model = _construct(cls, config, backends, dtype, device, max_positions)
    with torch.no_grad():
        if load_format == "dummy":
            init_dummy_weights(model, seed or 0)
        else:
            for p in model.parameters():
                p.fill_(float("nan"))  # anything the checkpoint does not fill stays NaN and is caught below
            weights = iter_checkpoint(model_path)
            if quantization is not None and quantization.from_checkpoint:
                weights = dequantized_weights(weights, experts_in_fp8=quantization.experts)
            model.load_weights(weights)
            missing = [n for n, p in model.named_parameters() if torch.isnan(p).any()]
            if missing:
                raise ValueError(f"checkpoint {model_path} did not provide: {', '.join(missing[:8])}"
                                 + (" ..." if len(missing) > 8 else ""))
        if quantization is not None:
            only_loaded = quantization.from_checkpoint and load_format != "dummy"
            turned = quantize_linears(model, only_fp8_loaded=only_loaded)
            logger.info("FP8 weights (e4m3, 128x128 block scales) in %d linear layers (%s)", turned,
                        "as the checkpoint stores them" if only_loaded else "quantized at load")
            if quantization.experts:
                logger.info("FP8 routed experts in %d MoE blocks", quantize_experts(model))
    return model.eval()


def _construct(cls, config: ModelConfig, backends, dtype: torch.dtype, device: torch.device | str,
               max_positions: int) -> torch.nn.Module:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            return cls(config, backends, max_positions)
    finally:
        torch.set_default_dtype(previous)


def _size_on_meta(cls, config: ModelConfig, backends, dtype: torch.dtype, max_positions: int) -> tuple[int, int]:
    """(parameter count, bytes of parameters and buffers) of the model as it would be built, from a copy
    on the meta device (no memory, no weights read)."""
    model = _construct(cls, config, backends, dtype, "meta", max_positions)
    tensors = [*model.parameters(), *model.buffers()]
    return sum(p.numel() for p in model.parameters()), sum(t.numel() * t.element_size() for t in tensors)


def available_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return available_ram_bytes()


def describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return str(device)


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
