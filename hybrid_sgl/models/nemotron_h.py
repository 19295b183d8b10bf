"""Nemotron-H (and Nemotron-3 MoE): one block per layer, each block RMSNorm -> one of {Mamba2,
attention without rope, relu2 MLP, sigmoid-routed relu2 MoE} -> residual. The block kinds come
from `hybrid_override_pattern` (M, *, -, E) or its list form `layers_block_type`. Weights live under
`backbone.` (transformers' own renaming, `model.`, is accepted too). Config: hybrid_sgl/config/nemotron_h.py."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from hybrid_sgl.batch import ForwardBatch
from hybrid_sgl.config import ModelConfig
from hybrid_sgl.layers.attention import GatedAttention
from hybrid_sgl.layers.backends import DenseOps
from hybrid_sgl.layers.mamba2 import Mamba2Mixer
from hybrid_sgl.layers.nemotron_moe import NemotronMoE
from hybrid_sgl.layers.norm import RMSNorm
from hybrid_sgl.layers.relu2_mlp import Relu2MLP
from hybrid_sgl.models.base import Backends, HybridCausalLM


class NemotronHBlock(nn.Module):
    """RMSNorm -> mixer (Mamba2 / attention, reading the batch) or FFN (MLP / MoE) -> residual."""

    def __init__(self, mixer: nn.Module, reads_batch: bool, hidden_size: int, eps: float, *, ops: DenseOps):
        """ops: the norm's kernels (Backends.dense)."""
        super().__init__()
        self.norm = RMSNorm(hidden_size, eps, ops=ops)
        self.mixer = mixer
        self.reads_batch = reads_batch

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, fb: ForwardBatch):
        """x: the previous block's output [T, H]; residual: the stream before it (None at layer 0).
        Returns (this block's output, residual stream)."""
        if residual is None:
            h, residual = self.norm(x), x
        else:
            h, residual = self.norm.add(x, residual)
        return (self.mixer(h, fb) if self.reads_batch else self.mixer(h)), residual


class NemotronHForCausalLM(HybridCausalLM):
    tensor_parallel = True
    skipped_prefixes = ("mtp.", "backbone.mtp.")  # multi-token-prediction head
    embed_name = "embeddings.weight"
    final_norm_names = ("norm_f.weight",)

    def __init__(self, config: ModelConfig, backends: Backends, max_positions: int):
        c = config
        dense = backends.dense
        super().__init__(config, backends, RMSNorm(c.hidden_size, c.rms_norm_eps, ops=dense))
        del max_positions  # no rotary embedding
        bias = bool(c.hf_text_config.get("mlp_bias", False))
        kv_index, state_index = 0, 0
        for mixer_kind, ffn_kind in c.layer_plan:
            if mixer_kind == "mamba2":
                body = Mamba2Mixer(spec=c.mamba2, hidden_size=c.hidden_size, eps=c.rms_norm_eps,
                                   state_index=state_index, ops=backends.ssm)
                state_index += 1
            elif mixer_kind == "full_attention":
                body = GatedAttention(spec=c.attention, hidden_size=c.hidden_size, eps=c.rms_norm_eps,
                                      norm_offset=0.0, kv_index=kv_index, rotary=None, ops=backends.attention)
                kv_index += 1
            elif ffn_kind == "moe":
                body = NemotronMoE(spec=c.moe, hidden_size=c.hidden_size, bias=bias, ops=backends.moe,
                                   latent_size=c.hf_text_config.get("moe_latent_size"))
            else:
                body = Relu2MLP(c.hidden_size, c.intermediate_size, bias, ops=dense)
            reads_batch = mixer_kind != "none"
            self.layers.append(NemotronHBlock(body, reads_batch, c.hidden_size, c.rms_norm_eps, ops=dense))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Accepts the original `backbone.` names and transformers' renamed `model.` ones."""
        super().load_weights(("backbone." + n[len("model."):] if n.startswith("model.") else n, t)
                             for n, t in weights)

    def load_layer_weight(self, layer: NemotronHBlock, part: str, rest: str, tensor: torch.Tensor) -> None:
        if part == "mixer":
            layer.mixer.load_weight(rest, tensor)
        elif part == "norm" and rest == "weight":
            layer.norm.weight.data.copy_(tensor)
        else:
            raise KeyError(f"{part}.{rest}")
