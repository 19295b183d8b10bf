"""Tiny composed-hybrid checkpoints: configs/hybrid-sgl-tiny/config.json (every mixer, every FFN kind)
or any other layer pattern with the same dimensions, random weights from the reference model, and the
small BPE tokenizer of `tiny_checkpoint`."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

TINY_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "hybrid-sgl-tiny" / "config.json"


def tiny_config(**overrides) -> dict:
    """configs/hybrid-sgl-tiny/config.json as a dict, with `overrides` replacing top-level fields
    (e.g. mixer_types and ffn_types together; num_hidden_layers follows mixer_types)."""
    config = json.loads(TINY_CONFIG.read_text())
    config.update(overrides)
    config["num_hidden_layers"] = len(config["mixer_types"])
    return config


def perturb(model, seed: int) -> None:
    """Move norms, SSM decays, dt biases, skips and biases off their initial values, so that a parity
    test also checks that each is read from the right place and applied."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(("dt_bias", "A_log", ".bias", ".D")):
                p.add_(torch.randn(p.shape, generator=gen) * 0.1)


def make_composed_checkpoint(path: str, seed: int = 0, **overrides) -> str:
    """Save a randomly initialized tiny composed hybrid (reference model) with its tokenizer into `path`."""
    sys.modules.setdefault("fla", None)  # HF's torch path on CPU
    import torch

    from hybrid_sgl.reference import HybridSGLReference
    from hybrid_sgl.testing.tiny_checkpoint import make_tokenizer

    os.makedirs(path, exist_ok=True)
    tokenizer = make_tokenizer(path)
    eos = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    config = tiny_config(vocab_size=len(tokenizer), eos_token_id=eos[0], **overrides)
    torch.manual_seed(seed)
    model = HybridSGLReference(config)
    perturb(model, seed)
    model.save_pretrained(path)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": eos, "do_sample": False}, f)
    return path
