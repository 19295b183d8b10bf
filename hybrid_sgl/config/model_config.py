"""ModelConfig: one normalized, frozen view of any supported HF config, with its layer plan.

`ModelConfig.from_hf(path)` reads `config.json` (and `generation_config.json` for EOS ids),
picks the family parser by `model_type` (CONFIG_PARSERS, filled by this package's __init__ with
the parser of each family module beside this one), and returns the same fields whatever names the
family uses. `layer_plan[i] = (mixer, ffn)` drives everything downstream; nothing inspects
modules at run time. Which mixer kinds own a KV-pool layer or a state-pool layer is said once,
here (KV_MIXERS, STATE_MIXERS).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field

MIXERS = ("full_attention", "linear_attention", "mamba2", "mamba", "attention_mamba2", "none")
FFNS = ("mlp", "moe", "none")
KV_MIXERS = ("full_attention", "attention_mamba2")  # layers with a KV-pool layer
STATE_MIXERS = ("linear_attention", "mamba2", "mamba", "attention_mamba2")  # layers with a state-pool layer


@dataclass(frozen=True)
class AttentionSpec:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int
    rope_theta: float
    output_gate: bool  # q_proj also produces a per-head sigmoid gate on the attention output
    qk_norm: bool
    bias: bool = False
    scale: float | None = None  # softmax scale; None = head_dim ** -0.5
    # rotary_dim = 0: no position encoding in attention (Nemotron-H, Jamba)


@dataclass(frozen=True)
class GDNSpec:
    """Gated DeltaNet (linear attention) dimensions."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class Mamba2Spec:
    """Mamba2 mixer dimensions (Nemotron-H, Falcon-H1, Granite-4.0-H, Bamba)."""

    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int
    conv_bias: bool = True
    proj_bias: bool = False  # in_proj bias (and out_proj's unless out_proj_bias says otherwise)
    out_proj_bias: bool | None = None  # None: as proj_bias (Falcon-H1 sets the two apart)
    gated_norm: bool = True  # y = norm(y * silu(z)) before out_proj; False: y * silu(z) without a norm
    norm_group_size: int = 0  # channels per group of the gated norm; 0 = intermediate_size / n_groups
    norm_before_gate: bool = False  # True: y = norm(y) * silu(z)
    dt_limit: tuple[float, float] = (0.0, float("inf"))

    @property
    def intermediate_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def out_bias(self) -> bool:
        return self.proj_bias if self.out_proj_bias is None else self.out_proj_bias

    @property
    def conv_dim(self) -> int:
        return self.intermediate_size + 2 * self.n_groups * self.state_size

    @property
    def state_shape(self) -> tuple[int, int, int]:
        return (self.num_heads, self.head_dim, self.state_size)


@dataclass(frozen=True)
class MambaSpec:
    """Mamba-1 (selective scan) mixer dimensions (Jamba)."""

    intermediate_size: int
    state_size: int
    conv_kernel: int
    dt_rank: int
    conv_bias: bool = True
    proj_bias: bool = False
    inner_norms: bool = True  # RMSNorm on dt, B and C (Jamba)

    @property
    def state_shape(self) -> tuple[int, int]:
        return (self.intermediate_size, self.state_size)


@dataclass(frozen=True)
class MoESpec:
    num_experts: int
    top_k: int
    intermediate_size: int
    norm_topk_prob: bool
    shared_expert_intermediate_size: int  # 0 when there is no shared expert
    shared_expert_gate: bool
    scoring: str = "softmax"  # router scores: "softmax" or "sigmoid" (Nemotron-H, with a correction bias)
    n_group: int = 1  # grouped top-k: pick topk_group groups of experts first (Nemotron-H)
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    activation: str = "silu"  # "silu": gated experts; "relu2": non-gated relu^2 experts


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    rms_norm_eps: float
    norm_offset: float  # 1.0 for zero-centered RMSNorm weights (x * (1 + w))
    hidden_act: str
    tie_word_embeddings: bool
    context_length: int
    dtype: str  # the checkpoint's dtype name, e.g. "bfloat16"
    layer_plan: tuple[tuple[str, str], ...]
    eos_token_ids: tuple[int, ...]
    attention: AttentionSpec
    gdn: GDNSpec | None = None
    moe: MoESpec | None = None
    mamba2: Mamba2Spec | None = None
    mamba: MambaSpec | None = None
    weight_prefix: str = "model."  # where the text model's weights live in the checkpoint
    mtp_layers: int = 0  # multi-token-prediction layers (`mtp.*`) the model is built with (0: none)
    hf_text_config: dict = field(default_factory=dict, compare=False, repr=False)
    quantization_config: dict | None = field(default=None, compare=False, repr=False)  # as config.json has it

    def __post_init__(self):
        for i, (mixer, ffn) in enumerate(self.layer_plan):
            if mixer not in MIXERS or ffn not in FFNS:
                raise ValueError(f"layer {i}: unknown plan entry ({mixer!r}, {ffn!r})")
            if mixer == "linear_attention" and self.gdn is None:
                raise ValueError(f"layer {i} is linear_attention but the config has no GDN dimensions")
            if mixer in ("mamba2", "attention_mamba2") and self.mamba2 is None:
                raise ValueError(f"layer {i} is {mixer} but the config has no Mamba2 dimensions")
            if mixer == "mamba" and self.mamba is None:
                raise ValueError(f"layer {i} is mamba but the config has no Mamba dimensions")
            if ffn == "moe" and self.moe is None:
                raise ValueError(f"layer {i} is MoE but the config has no MoE dimensions")
        self._check_state_kinds()

    def _check_state_kinds(self) -> None:
        """The state pool holds one recurrent state shape; a config whose recurrent_state_shapes()
        packs several kinds into one slot layout overrides both."""
        kinds = {m for m, _ in self.layer_plan if m in STATE_MIXERS and m != "attention_mamba2"}
        kinds |= {"mamba2"} if any(m == "attention_mamba2" for m, _ in self.layer_plan) else set()
        if len(kinds) > 1:
            raise ValueError(f"one model mixes recurrent layer kinds {sorted(kinds)}; the state pool holds one")

    @property
    def num_layers(self) -> int:
        return len(self.layer_plan)

    @property
    def kv_layers(self) -> list[int]:
        """Layers that own a KV-pool layer, in order."""
        return [i for i, (m, _) in enumerate(self.layer_plan) if m in KV_MIXERS]

    @property
    def state_layers(self) -> list[int]:
        """Layers that own a state-pool layer, in order."""
        return [i for i, (m, _) in enumerate(self.layer_plan) if m in STATE_MIXERS]

    def recurrent_state_shapes(self) -> tuple[tuple[int, int], tuple[int, ...]] | None:
        """(conv state [W - 1, conv channels], ssm state shape) of one slot of one state layer,
        or None when the model has no recurrent layers."""
        if not self.state_layers:
            return None
        if self.gdn is not None:
            g = self.gdn
            return (g.conv_kernel - 1, g.conv_dim), (g.num_v_heads, g.head_k_dim, g.head_v_dim)
        if self.mamba2 is not None:
            m = self.mamba2
            return (m.conv_kernel - 1, m.conv_dim), m.state_shape
        m = self.mamba
        return (m.conv_kernel - 1, m.intermediate_size), m.state_shape

    @staticmethod
    def from_hf(path: str) -> ModelConfig:
        with open(os.path.join(path, "config.json")) as f:
            hf = json.load(f)
        model_type = hf.get("model_type", "")
        parser = CONFIG_PARSERS.get(model_type)
        if parser is None:
            supported = ", ".join(sorted(CONFIG_PARSERS))
            arch = (hf.get("architectures") or ["?"])[0]
            raise ValueError(
                f"unsupported model: model_type={model_type!r} ({arch}); supported model types: {supported}"
            )
        config = parser(hf, _generation_eos(path))
        quant = quantization_config_of(hf)
        return dataclasses.replace(config, quantization_config=quant) if quant else config


# model_type -> parser(hf config dict, generation-config eos ids) -> ModelConfig
CONFIG_PARSERS: dict[str, Callable[[dict, list[int]], ModelConfig]] = {}


def quantization_config_of(hf: dict) -> dict | None:
    """config.json's quantization_config, at the top or in a multimodal checkpoint's text_config."""
    return hf.get("quantization_config") or (hf.get("text_config") or {}).get("quantization_config")


def _generation_eos(path: str) -> list[int]:
    gen_path = os.path.join(path, "generation_config.json")
    if not os.path.exists(gen_path):
        return []
    with open(gen_path) as f:
        return as_list(json.load(f).get("eos_token_id"))


def checkpoint_fields(hf: dict, gen_eos: list[int], default_architecture: str) -> dict:
    """The ModelConfig fields that the Mamba-family parsers read the same way from a flat HF config:
    architecture, model_type, vocab_size, dtype, and eos_token_ids (generation_config's first)."""
    return dict(
        architecture=(hf.get("architectures") or [default_architecture])[0],
        model_type=hf["model_type"],
        vocab_size=hf["vocab_size"],
        dtype=str(hf.get("dtype") or hf.get("torch_dtype") or "bfloat16"),
        eos_token_ids=tuple(dict.fromkeys(gen_eos + as_list(hf.get("eos_token_id")))),
    )


def as_list(value) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]


def json_float(value) -> float:
    """A float from config.json, where transformers writes non-finite ones as {"__float__": "Infinity"}."""
    return float(value["__float__"]) if isinstance(value, dict) else float(value)


def dt_limit(hf: dict) -> tuple[float, float]:
    """Mamba2's `time_step_limit` (dt clamp), default (0, inf)."""
    low, high = hf.get("time_step_limit") or (0.0, float("inf"))
    return json_float(low), json_float(high)


def rope_params(text: dict) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) from either the v5 `rope_parameters` dict or v4 fields."""
    rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ("default", "mrope"):
        raise ValueError(f"rope_type {rope_type!r} is not supported yet (supported: default)")
    theta = rope.get("rope_theta", text.get("rope_theta", 10000.0))
    partial = rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 1.0))
    return float(theta), float(partial)
