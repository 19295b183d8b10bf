"""Gated DeltaNet mixer (Qwen3-Next / Qwen3.5 linear attention).

in_proj -> [q k v | z | b | a]; causal conv1d + silu over [q k v]; gated delta rule with
state in the pool slot; per-head gated RMSNorm by silu(z); out_proj. All input projections
are fused into one matmul with rows in the canonical order above (the loader reorders
Qwen3-Next's per-key-head grouped layout).
"""

import torch
from torch import nn

from hybrid_sgl.config import GDNSpec
from hybrid_sgl.layers.backends import LinearAttnOps
from hybrid_sgl.layers.norm import GatedRMSNorm
from hybrid_sgl.runner.forward_batch import ForwardBatch


class GatedDeltaNet(nn.Module):
    def __init__(self, *, spec: GDNSpec, hidden_size: int, eps: float, state_index: int, ops: LinearAttnOps):
        super().__init__()
        self.spec = spec
        self.state_index = state_index  # which state-pool layer is ours
        self.ops = ops
        s = spec
        self.splits = [s.conv_dim, s.value_dim, s.num_v_heads, s.num_v_heads]  # qkv, z, b, a
        self.in_proj = nn.Linear(hidden_size, sum(self.splits), bias=False)
        self.conv_weight = nn.Parameter(torch.empty(s.conv_dim, s.conv_kernel))
        self.A_log = nn.Parameter(torch.empty(s.num_v_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.ones(s.num_v_heads, dtype=torch.float32))
        self.norm = GatedRMSNorm(s.head_v_dim, eps)
        self.out_proj = nn.Linear(s.value_dim, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""
        s, t = self.spec, x.shape[0]
        qkv, z, b, a = self.in_proj(x).split(self.splits, dim=-1)
        conv_states, ssm_states = fb.state_pool.layer(self.state_index)
        if fb.is_decode:
            qkv = self.ops.conv_update(x=qkv, weight=self.conv_weight, bias=None, conv_states=conv_states,
                                       state_slots=fb.state_slots, pad_slot=fb.state_pool.pad_slot)
            q, k, v = self._heads(qkv)
            o = self.ops.gdn_decode(q=q, k=k, v=v, a=a, b=b, A_log=self.A_log, dt_bias=self.dt_bias,
                                    ssm_states=ssm_states, state_slots=fb.state_slots, pad_slot=fb.state_pool.pad_slot)
        else:
            def core(cu_seqlens, state_slots, has_initial_state, qkv, a, b):
                qkv = self.ops.conv_prefill(x=qkv, weight=self.conv_weight, bias=None, conv_states=conv_states,
                                            cu_seqlens=cu_seqlens, state_slots=state_slots,
                                            has_initial_state=has_initial_state)
                q, k, v = self._heads(qkv)
                return self.ops.gdn_prefill(q=q, k=k, v=v, a=a, b=b, A_log=self.A_log, dt_bias=self.dt_bias,
                                            ssm_states=ssm_states, state_slots=state_slots, cu_seqlens=cu_seqlens,
                                            has_initial_state=has_initial_state)

            o = fb.recurrent(self.state_index, core, qkv, a, b)
        o = self.norm(o, z.view(t, s.num_v_heads, s.head_v_dim))  # [T, Hv, V]
        return self.out_proj(o.view(t, s.value_dim))

    def _heads(self, qkv: torch.Tensor):
        """[T, conv_dim] -> q, k [T, Hk, K], v [T, Hv, V]."""
        s, t = self.spec, qkv.shape[0]
        q, k, v = qkv.split([s.key_dim, s.key_dim, s.value_dim], dim=-1)
        return (q.reshape(t, s.num_k_heads, s.head_k_dim), k.reshape(t, s.num_k_heads, s.head_k_dim),
                v.reshape(t, s.num_v_heads, s.head_v_dim))

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """Checkpoint names: Qwen3.5 in_proj_{qkv,z,b,a}, Qwen3-Next in_proj_{qkvz,ba} (grouped per key
        head), conv1d.weight [C, 1, W], A_log, dt_bias, norm.weight, out_proj.weight."""
        s = self.spec
        w = self.in_proj.weight.data
        qkv_end = s.conv_dim
        z_end = qkv_end + s.value_dim
        b_end = z_end + s.num_v_heads
        rows = {"in_proj_qkv.weight": (0, qkv_end), "in_proj_z.weight": (qkv_end, z_end),
                "in_proj_b.weight": (z_end, b_end), "in_proj_a.weight": (b_end, w.shape[0])}
        if name in rows:
            start, end = rows[name]
            w[start:end].copy_(tensor)
        elif name == "in_proj_qkvz.weight":
            q, k, v, z = self._ungroup(tensor, [s.head_k_dim, s.head_k_dim, self._per_group(s.head_v_dim),
                                                self._per_group(s.head_v_dim)])
            w[:z_end].copy_(torch.cat([q, k, v, z]))
        elif name == "in_proj_ba.weight":
            b, a = self._ungroup(tensor, [self._per_group(1), self._per_group(1)])
            w[z_end:].copy_(torch.cat([b, a]))
        elif name == "conv1d.weight":
            self.conv_weight.data.copy_(tensor.reshape(s.conv_dim, s.conv_kernel))
        elif name in ("A_log", "dt_bias"):
            getattr(self, name).data.copy_(tensor)
        elif name in ("norm.weight", "out_proj.weight"):
            module, _, kind = name.partition(".")
            getattr(getattr(self, module), kind).data.copy_(tensor)
        else:
            raise KeyError(name)

    def _per_group(self, size: int) -> int:
        return self.spec.num_v_heads // self.spec.num_k_heads * size

    def _ungroup(self, tensor: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        """[Hk * sum(sizes), H] grouped by key head -> one [Hk * size, H] block per part."""
        grouped = tensor.view(self.spec.num_k_heads, sum(sizes), tensor.shape[-1])
        return [part.reshape(-1, tensor.shape[-1]) for part in grouped.split(sizes, dim=1)]
