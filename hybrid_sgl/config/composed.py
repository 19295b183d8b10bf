"""Config of a composed hybrid (`model_type` "hybrid_sgl", `HybridSGLForCausalLM`): any order of
full attention, Gated DeltaNet, Mamba2, Mamba and parallel attention+Mamba2 layers, each followed by
a dense MLP, a sparse MoE or nothing.

config.json names each layer's mixer and FFN, and gives each kind's dimensions in a section of its
own, in the field names of the HF family whose module the reference model uses for it:

    {"model_type": "hybrid_sgl", "architectures": ["HybridSGLForCausalLM"],
     "vocab_size": 400, "hidden_size": 64, "rms_norm_eps": 1e-6, "max_position_embeddings": 4096,
     "tie_word_embeddings": false, "initializer_range": 0.02, "eos_token_id": 2,
     "mixer_types": ["mamba2", "full_attention", "linear_attention", "mamba", "attention_mamba2"],
     "ffn_types":   ["mlp",    "moe",            "mlp",              "moe",   "none"],
     "full_attention":   {Qwen3.5 names: num_attention_heads, num_key_value_heads, head_dim,
                          rope_parameters {rope_theta, partial_rotary_factor}, attention_bias},
     "linear_attention": {Qwen3.5 names: linear_num_key_heads, linear_num_value_heads,
                          linear_key_head_dim, linear_value_head_dim, linear_conv_kernel_dim},
     "mamba2":           {Bamba names: mamba_n_heads, mamba_d_head, mamba_n_groups, mamba_d_state,
                          mamba_d_conv, mamba_expand, mamba_chunk_size, mamba_conv_bias,
                          mamba_proj_bias, time_step_limit},
     "mamba":            {Jamba names: mamba_d_state, mamba_d_conv, mamba_expand, mamba_dt_rank,
                          mamba_conv_bias, mamba_proj_bias},
     "mlp":              {intermediate_size},
     "moe":              {Qwen3-Next names: num_experts, num_experts_per_tok, moe_intermediate_size,
                          shared_expert_intermediate_size, norm_topk_prob}}

The plan is `mixer_types`, not `layer_types`: transformers checks `layer_types` entries against its
own attention kinds in any config.json it reads (AutoTokenizer reads it too).

A section is needed only when a layer uses its kind ("attention_mamba2" uses full_attention and
mamba2). Its dimension fields are required: a default would have to agree with the HF config class
the reference builds, so none is assumed. Layer norms are zero-centered RMSNorms (Qwen3.5's), one
`rms_norm_eps` serves every norm, activations are silu. The weight names are in
`hybrid_sgl.models.composed`.

Recurrent state: layers of different kinds have different state shapes, and the state pool holds one
shape per slot; `ComposedConfig.recurrent_state_shapes()` packs every state layer's conv and SSM
state flat into the largest kind's size, and the model reads each layer's own view of it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from hybrid_sgl.config.bamba import mamba2_spec
from hybrid_sgl.config.model_config import (
    FFNS,
    MIXERS,
    AttentionSpec,
    GDNSpec,
    MambaSpec,
    ModelConfig,
    MoESpec,
    checkpoint_fields,
    rope_params,
)

MODEL_TYPE = "hybrid_sgl"
ARCHITECTURE = "HybridSGLForCausalLM"
# section -> the fields it must give
REQUIRED = {
    "full_attention": ("num_attention_heads", "num_key_value_heads", "head_dim", "rope_parameters"),
    "linear_attention": ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
                         "linear_value_head_dim", "linear_conv_kernel_dim"),
    "mamba2": ("mamba_n_heads", "mamba_d_head", "mamba_n_groups", "mamba_d_state", "mamba_d_conv", "mamba_expand",
               "mamba_chunk_size"),
    "mamba": ("mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_dt_rank"),
    "mlp": ("intermediate_size",),
    "moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
            "norm_topk_prob"),
}
# layer-plan kind -> the config sections it reads
SECTIONS_OF = {"full_attention": ("full_attention",), "linear_attention": ("linear_attention",),
               "mamba2": ("mamba2",), "mamba": ("mamba",), "attention_mamba2": ("full_attention", "mamba2"),
               "mlp": ("mlp",), "moe": ("moe",), "none": ()}


@dataclass(frozen=True)
class ComposedConfig(ModelConfig):
    """ModelConfig of a composed hybrid: several recurrent kinds share the state pool, packed."""

    def _check_state_kinds(self) -> None:
        pass  # any mix: recurrent_state_shapes() packs the kinds

    def state_shapes_of(self, mixer: str) -> tuple[tuple[int, int], tuple[int, ...]]:
        """(conv state [W - 1, C], ssm state shape) of one slot of a layer of kind `mixer`."""
        if mixer == "linear_attention":
            g = self.gdn
            return (g.conv_kernel - 1, g.conv_dim), (g.num_v_heads, g.head_k_dim, g.head_v_dim)
        if mixer in ("mamba2", "attention_mamba2"):
            m = self.mamba2
            return (m.conv_kernel - 1, m.conv_dim), m.state_shape
        if mixer == "mamba":
            m = self.mamba
            return (m.conv_kernel - 1, m.intermediate_size), m.state_shape
        raise ValueError(f"{mixer!r} layers keep no recurrent state")

    def recurrent_state_shapes(self) -> tuple[tuple[int, int], tuple[int, ...]] | None:
        """Packed slot layout: conv [1, largest conv state numel], ssm [largest ssm state numel]."""
        if not self.state_layers:
            return None
        shapes = [self.state_shapes_of(self.layer_plan[i][0]) for i in self.state_layers]
        return (1, max(math.prod(c) for c, _ in shapes)), (max(math.prod(s) for _, s in shapes),)


def section(hf: dict, name: str) -> dict:
    """Config section `name`, with its required fields checked."""
    sec = hf.get(name)
    if not isinstance(sec, dict):
        raise ValueError(f"hybrid_sgl config: a layer uses {name!r} but the config has no {name!r} section; "
                         f"add one with {', '.join(REQUIRED[name])}")
    if missing := [k for k in REQUIRED[name] if k not in sec]:
        raise ValueError(f"hybrid_sgl config section {name!r} lacks {', '.join(missing)}")
    return sec


def layer_plan(hf: dict) -> tuple[tuple[str, str], ...]:
    """(mixer, ffn) per layer from `mixer_types` and `ffn_types`."""
    mixers, ffns = hf.get("mixer_types"), hf.get("ffn_types")
    if not mixers or not ffns or len(mixers) != len(ffns):
        raise ValueError("hybrid_sgl config needs `mixer_types` (one mixer per layer) and `ffn_types` (one FFN per "
                         f"layer) of the same length; got {mixers!r} and {ffns!r}")
    if hf.get("num_hidden_layers", len(mixers)) != len(mixers):
        raise ValueError(f"num_hidden_layers={hf['num_hidden_layers']} but mixer_types lists {len(mixers)} layers")
    for i, (mixer, ffn) in enumerate(zip(mixers, ffns)):
        if mixer not in MIXERS or ffn not in FFNS:
            raise ValueError(f"layer {i}: ({mixer!r}, {ffn!r}) is not a layer kind; mixers: {', '.join(MIXERS)}; "
                             f"ffns: {', '.join(FFNS)}")
        if mixer == "none" and ffn == "none":
            raise ValueError(f"layer {i} has neither a mixer nor an FFN")
    return tuple(zip(mixers, ffns))


def parse_config(hf: dict, gen_eos: list[int]) -> ComposedConfig:
    """config.json (as a dict) of a composed hybrid -> ComposedConfig."""
    if hf.get("hidden_act", "silu") not in ("silu", "swish"):
        raise ValueError(f"hidden_act {hf['hidden_act']!r} is not supported (supported: silu)")
    plan = layer_plan(hf)
    used = {s for kinds in plan for kind in kinds for s in SECTIONS_OF[kind]}
    hidden = hf["hidden_size"]
    return ComposedConfig(
        **checkpoint_fields(hf, gen_eos, ARCHITECTURE),
        hidden_size=hidden,
        intermediate_size=section(hf, "mlp")["intermediate_size"] if "mlp" in used else 0,
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        norm_offset=1.0,
        hidden_act="silu",
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        context_length=hf.get("max_position_embeddings", 32768),
        layer_plan=plan,
        attention=attention_spec(section(hf, "full_attention")) if "full_attention" in used else _NO_ATTENTION,
        gdn=gdn_spec(section(hf, "linear_attention")) if "linear_attention" in used else None,
        mamba2=mamba2_spec({**section(hf, "mamba2"), "hidden_size": hidden}) if "mamba2" in used else None,
        mamba=mamba_spec(section(hf, "mamba"), hidden) if "mamba" in used else None,
        moe=moe_spec(section(hf, "moe")) if "moe" in used else None,
        weight_prefix="model.",
        hf_text_config=hf,
    )


# a model without attention layers has no KV pool; the spec is never read
_NO_ATTENTION = AttentionSpec(num_heads=1, num_kv_heads=1, head_dim=1, rotary_dim=0, rope_theta=0.0,
                              output_gate=False, qk_norm=False)


def attention_spec(sec: dict) -> AttentionSpec:
    """Qwen3.5 gated attention: q_proj gives [q | gate] per head, q/k RMSNorm, partial rotary."""
    for key in ("rope_theta", "partial_rotary_factor"):
        if key not in sec["rope_parameters"]:
            raise ValueError(f"hybrid_sgl config section 'full_attention': rope_parameters lacks {key!r}")
    theta, partial = rope_params(sec)
    head_dim = sec["head_dim"]
    return AttentionSpec(num_heads=sec["num_attention_heads"], num_kv_heads=sec["num_key_value_heads"],
                         head_dim=head_dim, rotary_dim=int(head_dim * partial), rope_theta=theta, output_gate=True,
                         qk_norm=True, bias=bool(sec.get("attention_bias", False)))


def gdn_spec(sec: dict) -> GDNSpec:
    return GDNSpec(num_k_heads=sec["linear_num_key_heads"], num_v_heads=sec["linear_num_value_heads"],
                   head_k_dim=sec["linear_key_head_dim"], head_v_dim=sec["linear_value_head_dim"],
                   conv_kernel=sec["linear_conv_kernel_dim"])


def mamba_spec(sec: dict, hidden: int) -> MambaSpec:
    """Jamba's Mamba-1 mixer (RMSNorms on dt, B and C)."""
    dt_rank = sec["mamba_dt_rank"]
    return MambaSpec(intermediate_size=sec["mamba_expand"] * hidden, state_size=sec["mamba_d_state"],
                     conv_kernel=sec["mamba_d_conv"],
                     dt_rank=math.ceil(hidden / 16) if dt_rank == "auto" else int(dt_rank),
                     conv_bias=bool(sec.get("mamba_conv_bias", True)),
                     proj_bias=bool(sec.get("mamba_proj_bias", False)))


def moe_spec(sec: dict) -> MoESpec:
    """Qwen3-Next's sparse MoE block: softmax top-k router and a sigmoid-gated shared expert."""
    if sec["shared_expert_intermediate_size"] < 1:
        raise ValueError("hybrid_sgl config section 'moe': shared_expert_intermediate_size must be >= 1 (the "
                         "Qwen3-Next MoE block always has a shared expert)")
    return MoESpec(num_experts=sec["num_experts"], top_k=sec["num_experts_per_tok"],
                   intermediate_size=sec["moe_intermediate_size"], norm_topk_prob=bool(sec["norm_topk_prob"]),
                   shared_expert_intermediate_size=sec["shared_expert_intermediate_size"], shared_expert_gate=True)
