"""HF architecture name -> model class (imported lazily, so that start-up checks stay light), and the
check that a model splits over --tp-size ranks."""

import importlib

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.distributed.sharding import local_config

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


def check_tensor_parallel(config: ModelConfig, size: int, expert_parallel: bool = False) -> None:
    """Refuse, before any process starts, a model or head counts that --tp-size cannot split (and, with
    --ep-size, a model whose routed experts cannot be dealt out whole to the ranks)."""
    model_class(config).check_tensor_parallel(config, size)
    local_config(config, size)
    if expert_parallel:
        moe = config.moe
        if moe is None:
            raise ValueError(f"--ep-size {size}: {config.architecture} has no MoE layers; use --ep-size 1")
        if moe.scoring != "softmax":
            raise ValueError(f"--ep-size {size}: expert parallelism is built for softmax-routed MoE blocks "
                             f"(Qwen3.5-MoE, Qwen3-Next, Granite, Jamba), not {config.architecture}'s; use --ep-size 1")
        if moe.num_experts % size:
            raise ValueError(f"--ep-size {size}: num_experts {moe.num_experts} is not a multiple of {size}; "
                             "use --ep-size 1 (the experts' intermediate size splits instead)")
