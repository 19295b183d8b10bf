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
    "NemotronHForCausalLM": "hybrid_sgl.models.nemotron_h:NemotronHForCausalLM",
    "FalconH1ForCausalLM": "hybrid_sgl.models.falcon_h1:FalconH1ForCausalLM",
    "BambaForCausalLM": "hybrid_sgl.models.bamba:BambaForCausalLM",
    "GraniteMoeHybridForCausalLM": "hybrid_sgl.models.bamba:BambaForCausalLM",
    "JambaForCausalLM": "hybrid_sgl.models.jamba:JambaForCausalLM",
    "HybridSGLForCausalLM": "hybrid_sgl.models.composed:HybridSGLForCausalLM",
}


def model_class(config: ModelConfig):
    target = MODEL_CLASSES.get(config.architecture)
    if target is None:
        raise ValueError(f"unsupported architecture {config.architecture!r}; supported: "
                         f"{', '.join(sorted(MODEL_CLASSES))}")
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)
