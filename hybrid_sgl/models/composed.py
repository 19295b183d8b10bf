"""HybridSGLForCausalLM: a composed hybrid (config: `hybrid_sgl.config.composed`). Each layer
is norm -> mixer -> add, then norm -> FFN -> add; a layer whose mixer or FFN is "none" lacks that half.

Checkpoint weight names (stable; `hybrid_sgl.reference` writes them). H hidden, V vocab. The layer
norms, the final norm and q/k norms are zero-centered RMSNorms (y = x / rms * (1 + w), Qwen3.5's); the
norms inside the GDN, Mamba2 and Mamba mixers multiply by w, as in their families:

    model.embed_tokens.weight [V, H]; model.norm.weight [H]; lm_head.weight [V, H] (absent when tied)
    model.layers.{i}.input_layernorm.weight [H]           before the mixer
    model.layers.{i}.post_attention_layernorm.weight [H]  before the FFN
  full_attention (Qwen3.5 gated attention), heads Hq, Hkv, head_dim D:
    .self_attn.q_proj.weight [2 Hq D, H] (per head [q | gate]), .k_proj / .v_proj.weight [Hkv D, H],
    .o_proj.weight [H, Hq D] (+ .bias each with attention_bias), .q_norm / .k_norm.weight [D]
  linear_attention (Qwen3.5 Gated DeltaNet), heads Hk, Hv, dims K, V, conv width W:
    .linear_attn.in_proj_qkv.weight [2 Hk K + Hv V, H], .in_proj_z.weight [Hv V, H],
    .in_proj_b / .in_proj_a.weight [Hv, H], .conv1d.weight [2 Hk K + Hv V, 1, W], .A_log [Hv],
    .dt_bias [Hv], .norm.weight [V], .out_proj.weight [H, Hv V]
  mamba2 (Bamba mixer), heads Hm, head dim P, groups G, state N, inner I = Hm P, C = I + 2 G N:
    .mamba.in_proj.weight [I + C + Hm, H] (rows [z | x B C | dt]), .conv1d.weight [C, 1, W],
    .conv1d.bias [C], .A_log / .D / .dt_bias [Hm], .norm.weight [I], .out_proj.weight [H, I]
  mamba (Jamba mixer), inner I, state N, dt rank R:
    .mamba.in_proj.weight [2 I, H] (rows [x | z]), .conv1d.weight [I, 1, W], .conv1d.bias [I],
    .x_proj.weight [R + 2 N, I], .dt_proj.weight [I, R], .dt_proj.bias [I], .A_log [I, N], .D [I],
    .dt_layernorm.weight [R], .b_layernorm / .c_layernorm.weight [N], .out_proj.weight [H, I]
  attention_mamba2: both .self_attn.* and .mamba.* (Mamba2) above; their outputs are summed
  mlp: .mlp.gate_proj / .up_proj.weight [I, H], .mlp.down_proj.weight [H, I]
  moe (Qwen3-Next sparse block), E experts of size Ie, shared expert of size Is:
    .mlp.gate.weight [E, H], .mlp.experts.gate_up_proj [E, 2 Ie, H], .mlp.experts.down_proj [E, H, Ie],
    .mlp.shared_expert.{gate,up,down}_proj.weight, .mlp.shared_expert_gate.weight [1, H]
"""

from __future__ import annotations

import dataclasses
import math
import weakref

import torch
from torch import nn

from hybrid_sgl.batch import ForwardBatch
from hybrid_sgl.config import KV_MIXERS, STATE_MIXERS
from hybrid_sgl.config.composed import ComposedConfig
from hybrid_sgl.distributed import current_tp
from hybrid_sgl.distributed.sharding import local_config
from hybrid_sgl.layers.attention import GatedAttention
from hybrid_sgl.layers.backends import DenseOps
from hybrid_sgl.layers.decoder_layer import FFN, DecoderLayer, LayerWeightNames
from hybrid_sgl.layers.gdn import GatedDeltaNet
from hybrid_sgl.layers.mamba import MambaMixer
from hybrid_sgl.layers.mamba2 import Mamba2Mixer
from hybrid_sgl.layers.mlp import GatedMLP
from hybrid_sgl.layers.moe import SparseMoE
from hybrid_sgl.layers.norm import RMSNorm
from hybrid_sgl.layers.rotary import RotaryEmbedding
from hybrid_sgl.memory.state_pool import StatePool
from hybrid_sgl.models.base import Backends, HybridCausalLM


class PackedStates:
    """The state pool as a composed model's mixers read it: `layer(i)` and `pad_slot`. The pool's slots
    are packed (conv [S+1, 1, Cmax], ssm [S+1, Nmax] per state layer); `layer(i)` returns state layer i's
    (conv [S+1, W-1, C], ssm [S+1, *shape]) in its own kind's shape, as views into the slots (the kernels
    take any slot stride, contiguous within a slot). It keeps no reference to the pool object, which the
    model's table of PackedStates holds weakly."""

    def __init__(self, pool: StatePool, shapes: list[tuple[tuple[int, int], tuple[int, ...]]]):
        self.pad_slot = pool.pad_slot
        self._layers = []
        for index, (conv_shape, ssm_shape) in enumerate(shapes):
            conv, ssm = pool.layer(index)
            slots = conv.shape[0]
            conv = conv.view(slots, -1)[:, : math.prod(conv_shape)].view(slots, *conv_shape)
            ssm = ssm.view(slots, -1)[:, : math.prod(ssm_shape)].view(slots, *ssm_shape)
            self._layers.append((conv, ssm))

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self._layers[index]


class ParallelMixer(nn.Module):
    """attention_mamba2: attention and Mamba2 on the same normed input, their outputs summed."""

    def __init__(self, self_attn: GatedAttention, mamba: Mamba2Mixer):
        super().__init__()
        self.self_attn = self_attn
        self.mamba = mamba

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""
        return self.self_attn(x, fb) + self.mamba(x, fb)

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """Checkpoint names: self_attn.* (GatedAttention's) and mamba.* (Mamba2Mixer's)."""
        part, _, rest = name.partition(".")
        if part == "self_attn":
            self.self_attn.load_weight(rest, tensor)
        elif part == "mamba":
            self.mamba.load_weight(rest, tensor)
        else:
            raise KeyError(name)


# mixer kind -> checkpoint part names of its module(s)
_MIXER_PARTS = {"full_attention": ("self_attn",), "linear_attention": ("linear_attn",), "mamba2": ("mamba",),
                "mamba": ("mamba",), "attention_mamba2": ("self_attn", "mamba"), "none": ()}


class ComposedLayer(DecoderLayer):
    """A DecoderLayer with zero-centered norms whose mixer or FFN may be absent ("none"), and the checkpoint
    part names of its kinds."""

    def __init__(self, mixer_kind: str, mixer: nn.Module | None, ffn: FFN | None, hidden_size: int, eps: float, *,
                 ops: DenseOps):
        super().__init__(mixer, ffn, hidden_size, eps, 1.0, ops=ops)
        self.names = LayerWeightNames(mixer=_MIXER_PARTS[mixer_kind], ffn=("mlp",) if ffn is not None else ())

    def load_part(self, part: str, rest: str, tensor: torch.Tensor) -> None:
        if isinstance(self.mixer, ParallelMixer) and part in self.names.mixer:
            self.mixer.load_weight(f"{part}.{rest}", tensor)
        else:
            self.load_weight(part, rest, tensor, self.names)


class HybridSGLForCausalLM(HybridCausalLM):
    tensor_parallel = True

    def __init__(self, config: ComposedConfig, backends: Backends, max_positions: int):
        c, dense = config, backends.dense
        super().__init__(config, backends, RMSNorm(c.hidden_size, c.rms_norm_eps, 1.0, ops=dense))
        a = c.attention
        self.rotary = None
        if c.kv_layers and a.rotary_dim:
            self.rotary = RotaryEmbedding(head_dim=a.head_dim, rotary_dim=a.rotary_dim, base=a.rope_theta,
                                          max_positions=max_positions)
        local = local_config(c, current_tp().size)  # this rank's heads: what its packed slots hold
        self.state_shapes = [local.state_shapes_of(c.layer_plan[i][0]) for i in c.state_layers]
        self._packed: weakref.WeakKeyDictionary[StatePool, PackedStates] = weakref.WeakKeyDictionary()
        kv_index, state_index = 0, 0
        for mixer_kind, ffn_kind in c.layer_plan:
            mixer = self._mixer(mixer_kind, kv_index, state_index)
            kv_index += mixer_kind in KV_MIXERS
            state_index += mixer_kind in STATE_MIXERS
            ffn = None
            if ffn_kind == "moe":
                ffn = SparseMoE(spec=c.moe, hidden_size=c.hidden_size, ops=backends.moe)
            elif ffn_kind == "mlp":
                ffn = GatedMLP(c.hidden_size, c.intermediate_size, ops=dense)
            self.layers.append(ComposedLayer(mixer_kind, mixer, ffn, c.hidden_size, c.rms_norm_eps, ops=dense))

    def _mixer(self, kind: str, kv_index: int, state_index: int) -> nn.Module | None:
        c, b = self.config, self.backends
        common = dict(hidden_size=c.hidden_size, eps=c.rms_norm_eps)
        if kind in KV_MIXERS:
            attn = GatedAttention(spec=c.attention, norm_offset=1.0, kv_index=kv_index, rotary=self.rotary,
                                  ops=b.attention, **common)
            if kind == "full_attention":
                return attn
            return ParallelMixer(attn, Mamba2Mixer(spec=c.mamba2, state_index=state_index, ops=b.ssm, **common))
        if kind == "linear_attention":
            return GatedDeltaNet(spec=c.gdn, state_index=state_index, ops=b.linear_attention, **common)
        if kind == "mamba2":
            return Mamba2Mixer(spec=c.mamba2, state_index=state_index, ops=b.ssm, **common)
        if kind == "mamba":
            return MambaMixer(spec=c.mamba, state_index=state_index, ops=b.ssm, **common)
        return None

    def forward(self, fb: ForwardBatch) -> torch.Tensor:
        """Returns the final hidden states [T, H]; the mixers see the state pool through PackedStates."""
        if fb.state_pool is not None:
            fb = dataclasses.replace(fb, state_pool=self._packed_states(fb.state_pool))
        return super().forward(fb)

    def _packed_states(self, pool: StatePool) -> PackedStates:
        """PackedStates of `pool`, built once per pool and dropped with it (its views would keep a
        throw-away pool's memory alive)."""
        if pool not in self._packed:
            self._packed[pool] = PackedStates(pool, self.state_shapes)
        return self._packed[pool]

    def load_layer_weight(self, layer: ComposedLayer, part: str, rest: str, tensor: torch.Tensor) -> None:
        layer.load_part(part, rest, tensor)
