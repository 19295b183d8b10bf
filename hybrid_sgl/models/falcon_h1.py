"""Falcon-H1: every layer runs rotary attention and a Mamba2 mixer in parallel on the same normed
input (layer-plan mixer "attention_mamba2": one KV-pool layer and one state-pool layer each), adds
their outputs to the residual, then a gated MLP. The mup multipliers:

    embeddings * embedding_multiplier, logits * lm_head_multiplier
    mixer = mamba(h * ssm_in_multiplier) * ssm_out_multiplier
          + attention(h * attention_in_multiplier) * attention_out_multiplier  -> folded into the
            branches' input projection weights and output projections as they load
    keys * key_multiplier                    -> folded into the softmax scale
    in_proj segments [z | x | B | C | dt] * ssm_multipliers  -> Mamba2Mixer.in_proj_scale (folded into its rows)
    mlp = down(silu(gate x * g) * up x) * d, (g, d) = mlp_multipliers  -> folded into the weights

Config: hybrid_sgl/config/falcon_h1.py.
"""

from __future__ import annotations

import torch
from torch import nn

from hybrid_sgl.batch import ForwardBatch
from hybrid_sgl.config import ModelConfig
from hybrid_sgl.layers.attention import GatedAttention
from hybrid_sgl.layers.backends import DenseOps
from hybrid_sgl.layers.mamba2 import Mamba2Mixer
from hybrid_sgl.layers.mlp import GatedMLP
from hybrid_sgl.layers.norm import RMSNorm
from hybrid_sgl.layers.rotary import RotaryEmbedding
from hybrid_sgl.models.base import Backends, HybridCausalLM


def ssm_in_proj_scale(config: ModelConfig) -> torch.Tensor:
    """The Mamba2 in_proj output multipliers [2 I + 2 G N + H]: ssm_multipliers per segment z, x, B, C, dt."""
    m = config.mamba2
    multipliers = config.hf_text_config.get("ssm_multipliers") or [1.0] * 5
    sizes = [m.intermediate_size, m.intermediate_size, m.n_groups * m.state_size, m.n_groups * m.state_size,
             m.num_heads]
    return torch.cat([torch.full((n,), float(v), dtype=torch.float32) for n, v in zip(sizes, multipliers, strict=True)])


def _scaled(x: torch.Tensor, multiplier: float) -> torch.Tensor:
    return x if multiplier == 1.0 else x * multiplier


class FalconH1MLP(GatedMLP):
    """The gated MLP with (gate, down) mlp_multipliers folded into the weights as they load."""

    def __init__(self, hidden_size: int, intermediate_size: int, multipliers: tuple[float, float], *,
                 ops: DenseOps):
        super().__init__(hidden_size, intermediate_size, ops=ops)
        self.multipliers = {"gate_proj.weight": multipliers[0], "down_proj.weight": multipliers[1]}

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        super().load_weight(name, _scaled(tensor, self.multipliers.get(name, 1.0)))


# (branch, tensor) -> the multiplier folded into it as it loads
_FOLDED = {("mamba", "in_proj.weight"): "ssm_in_multiplier", ("mamba", "out_proj.weight"): "ssm_out_multiplier",
           ("mamba", "out_proj.bias"): "ssm_out_multiplier", ("self_attn", "o_proj.weight"): "attention_out_multiplier",
           ("self_attn", "o_proj.bias"): "attention_out_multiplier",
           **{("self_attn", f"{p}_proj.weight"): "attention_in_multiplier" for p in "qkv"}}


class FalconH1Layer(nn.Module):
    def __init__(self, config: ModelConfig, backends: Backends, rotary: RotaryEmbedding, index: int):
        super().__init__()
        c, hf, dense = config, config.hf_text_config, backends.dense
        self.input_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, ops=dense)
        self.self_attn = GatedAttention(spec=c.attention, hidden_size=c.hidden_size, eps=c.rms_norm_eps,
                                        norm_offset=0.0, kv_index=index, rotary=rotary, ops=backends.attention)
        self.mamba = Mamba2Mixer(spec=c.mamba2, hidden_size=c.hidden_size, eps=c.rms_norm_eps, state_index=index,
                                 ops=backends.ssm, in_proj_scale=ssm_in_proj_scale(c))
        self.pre_ff_norm = RMSNorm(c.hidden_size, c.rms_norm_eps, ops=dense)
        multipliers = hf.get("mlp_multipliers") or [1.0, 1.0]
        self.feed_forward = FalconH1MLP(c.hidden_size, c.intermediate_size,
                                        (float(multipliers[0]), float(multipliers[1])), ops=dense)
        self.multipliers = {name: float(hf.get(name, 1.0)) for name in (
            "attention_in_multiplier", "attention_out_multiplier", "ssm_in_multiplier", "ssm_out_multiplier")}

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, fb: ForwardBatch):
        """x: the previous layer's MLP output [T, H]; residual: the stream before it (None at layer 0).
        Returns (this layer's MLP output, residual stream)."""
        if residual is None:
            h, residual = self.input_norm(x), x
        else:
            h, residual = self.input_norm.add(x, residual)
        h, residual = self.pre_ff_norm.add(self.mamba(h, fb), residual, branch=self.self_attn(h, fb))
        return self.feed_forward(h), residual

    def load_weight(self, part: str, rest: str, tensor: torch.Tensor) -> None:
        """The branch multipliers are folded into the weights: an input multiplier into the input
        projections' weights (not their biases), an output multiplier into the output projection."""
        if part in ("input_layernorm", "pre_ff_layernorm") and rest == "weight":
            norm = self.input_norm if part == "input_layernorm" else self.pre_ff_norm
            norm.weight.data.copy_(tensor)
        elif part in ("mamba", "self_attn", "feed_forward"):
            name = _FOLDED.get((part, rest))
            getattr(self, part).load_weight(rest, _scaled(tensor, self.multipliers[name]) if name else tensor)
        else:
            raise KeyError(f"{part}.{rest}")


class FalconH1ForCausalLM(HybridCausalLM):
    tensor_parallel = True
    final_norm_names = ("final_layernorm.weight",)

    def __init__(self, config: ModelConfig, backends: Backends, max_positions: int):
        c = config
        super().__init__(config, backends, RMSNorm(c.hidden_size, c.rms_norm_eps, ops=backends.dense))
        self.embedding_scale = float(c.hf_text_config.get("embedding_multiplier", 1.0))
        self.logits_scale = float(c.hf_text_config.get("lm_head_multiplier", 1.0))
        rotary = RotaryEmbedding(head_dim=c.attention.head_dim, rotary_dim=c.attention.rotary_dim,
                                 base=c.attention.rope_theta, max_positions=max_positions)
        for i in range(c.num_layers):
            self.layers.append(FalconH1Layer(c, backends, rotary, i))


    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        if not name.endswith(".mamba.mup_vector"):  # a buffer computed from the config, saved by some exports
            super().load_weight(name, tensor)

    def load_layer_weight(self, layer: FalconH1Layer, part: str, rest: str, tensor: torch.Tensor) -> None:
        layer.load_weight(part, rest, tensor)
