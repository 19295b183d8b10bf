"""Write a checkpoint in the published FP8 block layout (DeepSeek-V3, Qwen3 FP8) from an unquantized one.

    python tools/fp8_checkpoint.py SRC_DIR DST_DIR [--quantize-experts]

Each quantized `X.weight` [N, K] becomes float8_e4m3fn with `X.weight_scale_inv`
[ceil(N/128), ceil(K/128)] float32 beside it (dequant = weight * scale of its 128 x 128 block), and
config.json gains quantization_config {quant_method fp8, fmt e4m3, weight_block_size [128, 128],
activation_scheme dynamic, modules_to_not_convert [...]}. Quantized: every 2-D linear weight except
embeddings, lm_head, MoE routers (`mlp.gate`, `shared_expert_gate`) and, unless --quantize-experts, the
routed experts (served dequantized into --dtype, or in FP8 with --enable-fp8-experts). Norms, conv and 1-D
tensors are copied as they are; so are the tokenizer and every other file. Shards keep their names; the index gains the
scales.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import torch
from safetensors import safe_open
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from triton_kernels.fp8_quant import FP8_BLOCK, quantize_fp8  # noqa: E402

NOT_LINEAR = ("embed_tokens", "lm_head", "norm", "conv1d", "embeddings")
ROUTERS = (".mlp.gate.weight", ".shared_expert_gate.weight", ".router.weight")


def quantizes(name: str, tensor: torch.Tensor, experts: bool) -> bool:
    """Whether the checkpoint tensor `name` is a linear weight that the FP8 layout stores in e4m3."""
    if not name.endswith(".weight") or tensor.dim() != 2 or not tensor.is_floating_point():
        return False
    if any(part in name for part in NOT_LINEAR) or name.endswith(ROUTERS):
        return False
    return experts or ".experts." not in name


def convert(src: str, dst: str, experts: bool = False) -> str:
    """Write the FP8 copy of checkpoint folder `src` into `dst` (created); returns dst."""
    os.makedirs(dst, exist_ok=True)
    index_path = os.path.join(src, "model.safetensors.index.json")
    shards = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors in {src}: pass an unquantized checkpoint folder")
    weight_map, kept = {}, []
    for shard in shards:
        out = {}
        with safe_open(os.path.join(src, shard), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                tensor = f.get_tensor(name)
                if tensor.dtype == torch.float8_e4m3fn or name.endswith("_scale_inv"):
                    raise ValueError(f"{src} is already quantized ({name}): pass its unquantized release")
                if quantizes(name, tensor, experts):
                    out[name], out[name + "_scale_inv"] = quantize_fp8(tensor)
                else:
                    out[name] = tensor.contiguous()
                    if name.endswith(".weight") and tensor.dim() == 2:
                        kept.append(name.removesuffix(".weight"))
        save_file(out, os.path.join(dst, shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(out, shard))
    for entry in os.listdir(src):
        if entry.endswith(".safetensors") or entry in ("config.json", "model.safetensors.index.json"):
            continue
        path = os.path.join(src, entry)
        (shutil.copytree if os.path.isdir(path) else shutil.copy2)(path, os.path.join(dst, entry))
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        index["weight_map"] = weight_map
        with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
            json.dump(index, f, indent=2)
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": [FP8_BLOCK, FP8_BLOCK], "modules_to_not_convert": kept}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return dst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("src", help="unquantized checkpoint folder (config.json + *.safetensors)")
    parser.add_argument("dst", help="folder to write the FP8 checkpoint into")
    parser.add_argument("--quantize-experts", action="store_true",
                        help="also store routed MoE experts in FP8 (the published layout; served dequantized unless "
                             "--enable-fp8-experts)")
    args = parser.parse_args()
    print(convert(args.src, args.dst, experts=args.quantize_experts))


if __name__ == "__main__":
    main()
