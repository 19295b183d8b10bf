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
"""

from __future__ import annotations

import torch
from torch import nn

from hybrid_sgl.batch import ForwardBatch
from hybrid_sgl.config import AttentionSpec, Mamba2Spec, ModelConfig, checkpoint_fields, dt_limit, rope_params
from hybrid_sgl.layers.attention import GatedAttention
from hybrid_sgl.layers.mamba2 import Mamba2Mixer
from hybrid_sgl.layers.mlp import GatedMLP
from hybrid_sgl.layers.norm import RMSNorm
from hybrid_sgl.layers.rotary import RotaryEmbedding
from hybrid_sgl.models.base import Backends, HybridCausalLM


def parse_config(hf: dict, gen_eos: list[int]) -> ModelConfig:
    if hf.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported (supported: silu)")
    if hf.get("mlp_bias", False):
        raise ValueError("falcon_h1 with mlp_bias=true is not supported (the gated MLP has no biases)")
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    head_dim = hf.get("head_dim") or hidden // heads
    theta, _ = rope_params(hf)  # transformers rotates the whole head whatever partial_rotary_factor says
    d_ssm = hf.get("mamba_d_ssm") or int(hf.get("mamba_expand", 2) * hidden)
    n_heads = hf.get("mamba_n_heads", 128)
    d_head = hf.get("mamba_d_head", "auto")
    d_head = d_ssm // n_heads if d_head in (None, "auto") else d_head
    if n_heads * d_head != d_ssm:
        raise ValueError(f"mamba_n_heads * mamba_d_head = {n_heads} * {d_head} != mamba_d_ssm = {d_ssm}")
    return ModelConfig(
        **checkpoint_fields(hf, gen_eos, "FalconH1ForCausalLM"),
        hidden_size=hidden,
        intermediate_size=hf["intermediate_size"],
        rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
        norm_offset=0.0,
        hidden_act=hf.get("hidden_act", "silu"),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        context_length=hf.get("max_position_embeddings", 8192),
        layer_plan=(("attention_mamba2", "mlp"),) * hf["num_hidden_layers"],
        attention=AttentionSpec(
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rotary_dim=head_dim,
            rope_theta=theta,
            output_gate=False,
            qk_norm=False,
            bias=bool(hf.get("attention_bias", False)),
            scale=head_dim**-0.5 * float(hf.get("key_multiplier", 1.0)),  # q.(m k) = m (q.k)
        ),
        mamba2=Mamba2Spec(
            num_heads=n_heads,
            head_dim=d_head,
            state_size=hf.get("mamba_d_state", 256),
            n_groups=hf.get("mamba_n_groups", 1),
            conv_kernel=hf.get("mamba_d_conv", 4),
            chunk_size=hf.get("mamba_chunk_size", 256),
            conv_bias=bool(hf.get("mamba_conv_bias", True)),
            proj_bias=bool(hf.get("mamba_proj_bias", False)),
            out_proj_bias=bool(hf.get("projectors_bias", False)),
            gated_norm=bool(hf.get("mamba_rms_norm", False)),
            norm_before_gate=bool(hf.get("mamba_norm_before_gate", True)),
            dt_limit=dt_limit(hf),
        ),
        weight_prefix="model.",
        hf_text_config=hf,
    )


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

    def __init__(self, hidden_size: int, intermediate_size: int, multipliers: tuple[float, float]):
        super().__init__(hidden_size, intermediate_size)
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
        c, hf = config, config.hf_text_config
        self.input_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.self_attn = GatedAttention(spec=c.attention, hidden_size=c.hidden_size, eps=c.rms_norm_eps,
                                        norm_offset=0.0, kv_index=index, rotary=rotary, ops=backends.attention)
        self.mamba = Mamba2Mixer(spec=c.mamba2, hidden_size=c.hidden_size, eps=c.rms_norm_eps, state_index=index,
                                 ops=backends.ssm, in_proj_scale=ssm_in_proj_scale(c))
        self.pre_ff_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        multipliers = hf.get("mlp_multipliers") or [1.0, 1.0]
        self.feed_forward = FalconH1MLP(c.hidden_size, c.intermediate_size, (float(multipliers[0]),
                                                                              float(multipliers[1])))
        self.multipliers = {name: float(hf.get(name, 1.0)) for name in (
            "attention_in_multiplier", "attention_out_multiplier", "ssm_in_multiplier", "ssm_out_multiplier")}

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, fb: ForwardBatch):
        """x: the previous layer's MLP output [T, H]; residual: the stream before it (None at layer 0).
        Returns (this layer's MLP output, residual stream)."""
        if residual is None:
            h, residual = self.input_norm(x), x
        else:
            h, residual = self.input_norm.add(x, residual)
        h, residual = self.pre_ff_norm.add(self.mamba(h, fb) + self.self_attn(h, fb), residual)
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
        super().__init__(config, backends, RMSNorm(c.hidden_size, c.rms_norm_eps))
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
