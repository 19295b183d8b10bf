"""Full attention over the paged KV cache, with the options the hybrid families use: q/k RMSNorm
and a per-head sigmoid output gate (Qwen3-Next / Qwen3.5: q_proj produces [q | gate] per head),
partial or no rotary (rotary None: Nemotron-H, Jamba), biases, and a softmax scale from the
config (Granite). q, k, v projections are fused into one matmul.

Tensor parallel: q heads (with their gate rows) split over the ranks, KV heads split or replicated
when fewer than the ranks; o_proj is row-parallel (one all-reduce)."""

import torch
from torch import nn

from hybrid_sgl.batch import ForwardBatch
from hybrid_sgl.config import AttentionSpec
from hybrid_sgl.distributed import current_tp
from hybrid_sgl.distributed.sharding import attention_splits
from hybrid_sgl.layers.backends import AttentionOps
from hybrid_sgl.layers.linear import Block, ColumnParallelLinear, RowParallelLinear
from hybrid_sgl.layers.norm import RMSNorm
from hybrid_sgl.layers.rotary import RotaryEmbedding


class GatedAttention(nn.Module):
    def __init__(self, *, spec: AttentionSpec, hidden_size: int, eps: float, norm_offset: float,
                 kv_index: int, rotary: RotaryEmbedding | None, ops: AttentionOps):
        super().__init__()
        self.spec = spec
        self.kv_index = kv_index  # which KV-pool layer is ours
        self.ops = ops
        self.dense = dense = ops.dense
        self.rotary = rotary
        q_split, kv_split = attention_splits(spec, current_tp().size)
        self.num_heads, self.num_kv_heads = q_split.local, kv_split.local  # this rank's
        hq, hkv, d = self.num_heads, self.num_kv_heads, spec.head_dim
        self.q_size = hq * d * (2 if spec.output_gate else 1)
        self.kv_size = hkv * d
        self.scale = d**-0.5 if spec.scale is None else spec.scale
        blocks = [Block("q_proj", d * (2 if spec.output_gate else 1), q_split), Block("k_proj", d, kv_split),
                  Block("v_proj", d, kv_split)]
        self.qkv_proj = ColumnParallelLinear(hidden_size, blocks, bias=spec.bias, ops=dense)
        self.o_proj = RowParallelLinear(Block("o_proj", d, q_split), hidden_size, bias=spec.bias, ops=dense)
        self.q_norm = RMSNorm(d, eps, norm_offset, ops=dense) if spec.qk_norm else None
        self.k_norm = RMSNorm(d, eps, norm_offset, ops=dense) if spec.qk_norm else None

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.spec.head_dim
        t = x.shape[0]
        qg, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.spec.output_gate:
            qg = qg.view(t, hq, 2 * d)
            q, gate = qg[..., :d], qg[..., d:]  # strided views [T, Hq, D]
        else:
            q, gate = qg.view(t, hq, d), None
        k, v = k.view(t, hkv, d), v.view(t, hkv, d)
        q, k = self._position_and_norm(q, k, fb.positions)
        k_cache, v_cache = fb.kv_pool.layer(self.kv_index)
        self.ops.store_kv(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=fb.slot_mapping)
        if fb.is_decode:
            o = self.ops.decode(q=q, k_cache=k_cache, v_cache=v_cache, block_table=fb.block_table,
                                seq_lens=fb.seq_lens, scale=self.scale)
        else:
            o = self.ops.extend(q=q, k_cache=k_cache, v_cache=v_cache, block_table=fb.block_table,
                                cu_seqlens_q=fb.cu_seqlens, seq_lens=fb.seq_lens, scale=self.scale)
        if gate is not None:
            o = self.dense.sigmoid_gate_mul(o=o, gate=gate)
        return self.o_proj(o.reshape(t, hq * d))

    def _position_and_norm(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        """q: [T, Hq, D], k: [T, Hkv, D] -> normed (if qk_norm) and rotated (if rotary) q, k."""
        if self.q_norm is not None and self.rotary is not None:  # one pass
            return self.dense.qk_norm_rope(q=q, k=k, q_weight=self.q_norm.weight, k_weight=self.k_norm.weight,
                                           cos_sin=self.rotary.cos_sin, positions=positions, eps=self.q_norm.eps,
                                           offset=self.q_norm.offset, rotary_dim=self.rotary.rotary_dim)
        if self.rotary is not None:  # one pass too
            return self.dense.rope(q=q, k=k, cos_sin=self.rotary.cos_sin, positions=positions,
                                   rotary_dim=self.rotary.rotary_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """Checkpoint names: {q,k,v,o}_proj.{weight,bias}, {q,k}_norm.weight."""
        proj, _, kind = name.partition(".")
        if proj in ("q_proj", "k_proj", "v_proj"):
            self.qkv_proj.load(proj, tensor, kind)
        elif proj == "o_proj":
            self.o_proj.load(tensor, kind)
        elif proj in ("q_norm", "k_norm") and self.q_norm is not None:
            getattr(getattr(self, proj), kind).data.copy_(tensor)
        else:
            raise KeyError(name)
