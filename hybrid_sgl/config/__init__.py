"""Model configs: `ModelConfig` (model_config.py), one normalized, frozen view of any supported HF
config with its layer plan, and one module per family that turns that family's config.json into it.

This package is data and parsing only: it imports nothing of the models. Each family module's
`parse_config(hf, generation eos ids)` is registered below under the model types it reads, which is
where `ModelConfig.from_hf` finds it.
"""

from hybrid_sgl.config import bamba, composed, falcon_h1, jamba, nemotron_h, qwen3_next
from hybrid_sgl.config.model_config import (
    CONFIG_PARSERS,
    FFNS,
    KV_MIXERS,
    MIXERS,
    STATE_MIXERS,
    AttentionSpec,
    GDNSpec,
    Mamba2Spec,
    MambaSpec,
    ModelConfig,
    MoESpec,
    as_list,
    checkpoint_fields,
    dt_limit,
    json_float,
    quantization_config_of,
    rope_params,
)

CONFIG_PARSERS.update({
    "qwen3_next": qwen3_next.parse_config,
    "qwen3_5": qwen3_next.parse_config,
    "qwen3_5_text": qwen3_next.parse_config,
    "qwen3_5_moe": qwen3_next.parse_config,
    "qwen3_5_moe_text": qwen3_next.parse_config,
    "nemotron_h": nemotron_h.parse_config,
    "falcon_h1": falcon_h1.parse_config,
    "bamba": bamba.parse_config,
    "granitemoehybrid": bamba.parse_config,
    "jamba": jamba.parse_config,
    composed.MODEL_TYPE: composed.parse_config,
})

__all__ = ["CONFIG_PARSERS", "FFNS", "KV_MIXERS", "MIXERS", "STATE_MIXERS", "AttentionSpec", "GDNSpec", "Mamba2Spec",
           "MambaSpec", "ModelConfig", "MoESpec", "as_list", "checkpoint_fields", "dt_limit", "json_float",
           "quantization_config_of", "rope_params"]
