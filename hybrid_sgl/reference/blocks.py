"""HF transformers' own modules for each layer kind of a composed hybrid, built from the kind's config
section (field names as in `hybrid_sgl.config.composed`) through the family's own config class,
so that HF, not our parser, interprets every field:

    full_attention    Qwen3_5Attention + Qwen3_5TextRotaryEmbedding   (Qwen3_5TextConfig)
    linear_attention  Qwen3_5GatedDeltaNet                            (Qwen3_5TextConfig)
    mamba2            BambaMixer                                      (BambaConfig)
    mamba             JambaMambaMixer                                 (JambaConfig)
    mlp               Qwen3_5MLP                                      (Qwen3_5TextConfig)
    moe               Qwen3NextSparseMoeBlock                         (Qwen3NextConfig)
    norms             Qwen3_5RMSNorm (zero-centered)

Every module runs without a cache (full-sequence forward), which is all the reference needs. On a
machine without CUDA, `fla` is hidden before transformers loads these modules, so that HF runs its
torch path (its import would fail or pick GPU kernels)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch
from torch import nn

from hybrid_sgl.config.composed import section


def hf_modules() -> SimpleNamespace:
    """The transformers modeling modules used here, imported on first use."""
    if not torch.cuda.is_available():
        sys.modules.setdefault("fla", None)
    from transformers.models.bamba import modeling_bamba
    from transformers.models.jamba import modeling_jamba
    from transformers.models.qwen3_5 import modeling_qwen3_5
    from transformers.models.qwen3_next import modeling_qwen3_next

    return SimpleNamespace(qwen3_5=modeling_qwen3_5, qwen3_next=modeling_qwen3_next, bamba=modeling_bamba,
                           jamba=modeling_jamba)


class Blocks:
    """Builds HF modules for the layer kinds of one composed config (config.json as a dict)."""

    def __init__(self, config: dict):
        import transformers as tf

        self.config = config
        self.hf = hf_modules()
        self._tf = tf
        self.hidden = config["hidden_size"]
        self.eps = config.get("rms_norm_eps", 1e-6)

    def _common(self) -> dict:
        return dict(hidden_size=self.hidden, rms_norm_eps=self.eps, hidden_act="silu", num_hidden_layers=1,
                    vocab_size=self.config["vocab_size"],
                    max_position_embeddings=self.config.get("max_position_embeddings", 32768))

    def _qwen3_5(self, kind: str, sec: dict):
        cfg = self._tf.Qwen3_5TextConfig(**self._common(), layer_types=[kind], **sec)
        cfg._attn_implementation = "sdpa"  # causal without a mask
        return cfg

    def norm(self) -> nn.Module:
        return self.hf.qwen3_5.Qwen3_5RMSNorm(self.hidden, eps=self.eps)

    def attention(self) -> nn.Module:
        """forward(hidden_states [B, T, H], position_embeddings, attention_mask=None) -> ([B, T, H], _)."""
        cfg = self._qwen3_5("full_attention", section(self.config, "full_attention"))
        return self.hf.qwen3_5.Qwen3_5Attention(cfg, 0)

    def rotary(self) -> nn.Module:
        """forward(x, position_ids [B, T]) -> (cos, sin) for the attention layers."""
        cfg = self._qwen3_5("full_attention", section(self.config, "full_attention"))
        return self.hf.qwen3_5.Qwen3_5TextRotaryEmbedding(cfg)

    def gdn(self) -> nn.Module:
        """forward(hidden_states [B, T, H]) -> [B, T, H]."""
        sec = section(self.config, "linear_attention")
        return self.hf.qwen3_5.Qwen3_5GatedDeltaNet(self._qwen3_5("linear_attention", sec), 0)

    def mamba2(self) -> nn.Module:
        """forward(hidden_states [B, T, H]) -> [B, T, H]."""
        cfg = self._tf.BambaConfig(**self._common(), **section(self.config, "mamba2"))
        return self.hf.bamba.BambaMixer(cfg, 0)

    def mamba(self) -> nn.Module:
        """forward(hidden_states [B, T, H]) -> [B, T, H]."""
        cfg = self._tf.JambaConfig(**self._common(), **section(self.config, "mamba"))
        return self.hf.jamba.JambaMambaMixer(cfg, 0)

    def mlp(self) -> nn.Module:
        sec = section(self.config, "mlp")
        return self.hf.qwen3_5.Qwen3_5MLP(self._qwen3_5("full_attention", {}), sec["intermediate_size"])

    def moe(self) -> nn.Module:
        """forward(hidden_states [B, T, H]) -> [B, T, H]."""
        cfg = self._tf.Qwen3NextConfig(**self._common(), **section(self.config, "moe"))
        cfg._experts_implementation = "eager"  # the per-expert loop, as HF's own models default to on CPU
        return self.hf.qwen3_next.Qwen3NextSparseMoeBlock(cfg)

    def init_weights(self, module: nn.Module, std: float) -> None:
        """What HF's _init_weights does for these modules: normal(0, std) matrices, embeddings, experts
        and routers, zero biases; norms and SSM parameters keep the values their modules set."""
        experts = (self.hf.qwen3_next.Qwen3NextExperts,)
        with torch.no_grad():
            for m in module.modules():
                if isinstance(m, nn.Linear | nn.Embedding):
                    m.weight.normal_(0.0, std)
                    if getattr(m, "bias", None) is not None:
                        m.bias.zero_()
                elif isinstance(m, experts):
                    m.gate_up_proj.normal_(0.0, std)
                    m.down_proj.normal_(0.0, std)
                elif isinstance(m, self.hf.qwen3_next.Qwen3NextTopKRouter):
                    m.weight.normal_(0.0, std)
