"""HF architecture name -> model class (imported lazily)."""

import importlib

from hybrid_sgl.config import ModelConfig

_QWEN3_GDN = "hybrid_sgl.models.qwen3_next:Qwen3NextForCausalLM"
MODEL_CLASSES = {
    "Qwen3NextForCausalLM": _QWEN3_GDN,
    "Qwen3_5ForCausalLM": _QWEN3_GDN,
    "Qwen3_5ForConditionalGeneration": _QWEN3_GDN,
    "Qwen3_5MoeForCausalLM": _QWEN3_GDN,
    "Qwen3_5MoeForConditionalGeneration": _QWEN3_GDN,
}


def model_class(config: ModelConfig):
    target = MODEL_CLASSES.get(config.architecture)
    if target is None:
        raise ValueError(f"unsupported architecture {config.architecture!r}; supported: "
                         f"{', '.join(sorted(MODEL_CLASSES))}")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
