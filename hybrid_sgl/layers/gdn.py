"""Gated DeltaNet mixer (Qwen3-Next / Qwen3.5 linear attention).

in_proj -> [q k v | z | b | a]; causal conv1d + silu over [q k v]; gated delta rule with
state in the pool slot; per-head gated RMSNorm by silu(z) (at decode inside the delta-rule kernel);
out_proj. All input projections
are fused into one matmul with rows in the canonical order above (the loader reorders
Qwen3-Next's per-key-head grouped layout).

Tensor parallel: key and value heads split over the ranks, the conv1d channels of q, k and v
with them; out_proj is row-parallel. `spec` holds this rank's heads, `full` the checkpoint's.
Each rank's state slots hold its own heads' state, which no rank ever needs from another.
"""

import dataclasses

import torch
from torch import nn

from hybrid_sgl.batch import ForwardBatch
from hybrid_sgl.config import GDNSpec
from hybrid_sgl.distributed import current_tp
from hybrid_sgl.distributed.sharding import gdn_splits
from hybrid_sgl.layers.backends import LinearAttnOps
from hybrid_sgl.layers.linear import Block, ColumnParallelLinear, RowParallelLinear
from hybrid_sgl.layers.norm import GatedRMSNorm


class GatedDeltaNet(nn.Module):
    def __init__(self, *, spec: GDNSpec, hidden_size: int, eps: float, state_index: int, ops: LinearAttnOps):
        super().__init__()
        self.tp = current_tp()
        k_split, v_split = gdn_splits(spec, self.tp.size)
        self.full = spec
        self.spec = s = dataclasses.replace(spec, num_k_heads=k_split.local, num_v_heads=v_split.local)
        self.state_index = state_index  # which state-pool layer is ours
        self.ops = ops
        self.splits = [s.conv_dim, s.value_dim, s.num_v_heads, s.num_v_heads]  # qkv, z, b, a
        self.conv_blocks = [Block("q", s.head_k_dim, k_split), Block("k", s.head_k_dim, k_split),
                            Block("v", s.head_v_dim, v_split)]
        blocks = [*self.conv_blocks, Block("z", s.head_v_dim, v_split), Block("b", 1, v_split), Block("a", 1, v_split)]
        self.in_proj = ColumnParallelLinear(hidden_size, blocks, ops=ops.dense)
        self.head_block = Block("heads", 1, v_split)  # A_log, dt_bias
        self.conv_weight = nn.Parameter(torch.empty(s.conv_dim, s.conv_kernel))
        self.A_log = nn.Parameter(torch.empty(s.num_v_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.ones(s.num_v_heads, dtype=torch.float32))
        self.norm = GatedRMSNorm(s.head_v_dim, eps, ops=ops.dense)
        self.out_proj = RowParallelLinear(Block("out_proj", s.head_v_dim, v_split), hidden_size, ops=ops.dense)
        self.kept: KeptInputs | None = None  # speculative verify steps' inputs (keep_inputs_for_replay)

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""
        s, t = self.spec, x.shape[0]
        qkv, z, b, a = self.in_proj(x).split(self.splits, dim=-1)
        conv_states, ssm_states = fb.state_pool.layer(self.state_index)
        z = z.view(t, s.num_v_heads, s.head_v_dim)
        if fb.is_decode:
            qkv = self.ops.conv_update(x=qkv, weight=self.conv_weight, bias=None, conv_states=conv_states,
                                       state_slots=fb.state_slots, pad_slot=fb.state_pool.pad_slot)
            q, k, v = self._heads(qkv)
            o = self.ops.gdn_decode(q=q, k=k, v=v, a=a, b=b, A_log=self.A_log, dt_bias=self.dt_bias,
                                    ssm_states=ssm_states, state_slots=fb.state_slots, pad_slot=fb.state_pool.pad_slot,
                                    z=z, norm_weight=self.norm.weight, norm_eps=self.norm.eps)  # normed in the kernel
            return self.out_proj(o.view(t, s.value_dim))

        # short rows (verify steps): token by token, pad rows skipped; else in 64-token chunks
        short = {"pad_slot": fb.state_pool.pad_slot} if fb.short_rows else {}
        conv = self.ops.conv_rows if fb.short_rows else self.ops.conv_prefill
        recurrence = self.ops.gdn_rows if fb.short_rows else self.ops.gdn_prefill

        def core(cu_seqlens, state_slots, has_initial_state, cuts, qkv, a, b):
            qkv = conv(x=qkv, weight=self.conv_weight, bias=None, conv_states=conv_states, cu_seqlens=cu_seqlens,
                       state_slots=state_slots, has_initial_state=has_initial_state, **cuts, **short)
            q, k, v = self._heads(qkv)
            written = cuts
            if fb.replay_recurrent:  # no state written: the slots stay checkpoints, the kept tokens run in replay()
                self.kept.keep(q, k, v, a, b)
                written = {"write_final": False}
            return recurrence(q=q, k=k, v=v, a=a, b=b, A_log=self.A_log, dt_bias=self.dt_bias, ssm_states=ssm_states,
                              state_slots=state_slots, cu_seqlens=cu_seqlens, has_initial_state=has_initial_state,
                              **written, **short)

        o = fb.recurrent(core, qkv, a, b)
        o = self.norm(o, z)  # [T, Hv, V]
        return self.out_proj(o.view(t, s.value_dim))

    def keep_inputs_for_replay(self, max_tokens: int, dtype: torch.dtype, device: torch.device) -> None:
        """Static buffers for the inputs of replayed verify steps (before their graphs are captured)."""
        self.kept = KeptInputs(self.spec, max_tokens, dtype, device)

    def replay(self, state_pool, rows: dict[str, torch.Tensor], row_lens: torch.Tensor, n: int) -> None:
        """Run the first row_lens[i] tokens of each row of the last replayed verify step again, from the slots
        it left as they were, writing the slots: the state after the tokens each row kept. rows: that step's
        real rows, packed first in its kept inputs (cu_seqlens [B + 1], state_slots [B], has_initial_state
        [B]), n = their tokens; row_lens [B] int32."""
        kept = self.kept
        self.ops.gdn_rows(q=kept.q[:n], k=kept.k[:n], v=kept.v[:n], a=kept.a[:n], b=kept.b[:n], A_log=self.A_log,
                          dt_bias=self.dt_bias, ssm_states=state_pool.layer(self.state_index)[1], **rows,
                          pad_slot=state_pool.pad_slot, row_lens=row_lens)

    def _heads(self, qkv: torch.Tensor):
        """[T, conv_dim] -> q, k [T, Hk, K], v [T, Hv, V]."""
        s, t = self.spec, qkv.shape[0]
        q, k, v = qkv.split([s.key_dim, s.key_dim, s.value_dim], dim=-1)
        return (q.reshape(t, s.num_k_heads, s.head_k_dim), k.reshape(t, s.num_k_heads, s.head_k_dim),
                v.reshape(t, s.num_v_heads, s.head_v_dim))

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """Checkpoint names: Qwen3.5 in_proj_{qkv,z,b,a}, Qwen3-Next in_proj_{qkvz,ba} (grouped per key
        head), conv1d.weight [C, 1, W], A_log, dt_bias, norm.weight, out_proj.weight."""
        f = self.full
        if name in ("in_proj_qkv.weight", "in_proj_qkvz.weight"):
            if name == "in_proj_qkv.weight":
                q, k, v = tensor.split([f.key_dim, f.key_dim, f.value_dim])
            else:
                q, k, v, z = self._ungroup(tensor, [f.head_k_dim, f.head_k_dim, self._per_group(f.head_v_dim),
                                                    self._per_group(f.head_v_dim)])
                self.in_proj.load("z", z)
            for part, rows in zip("qkv", (q, k, v)):
                self.in_proj.load(part, rows)
        elif name in ("in_proj_z.weight", "in_proj_b.weight", "in_proj_a.weight"):
            self.in_proj.load(name[len("in_proj_")], tensor)
        elif name == "in_proj_ba.weight":
            b, a = self._ungroup(tensor, [self._per_group(1), self._per_group(1)])
            self.in_proj.load("b", b)
            self.in_proj.load("a", a)
        elif name == "conv1d.weight":
            rows = tensor.reshape(f.conv_dim, f.conv_kernel).split([f.key_dim, f.key_dim, f.value_dim])
            self.conv_weight.data.copy_(torch.cat([b.rows_of(r, self.tp.rank) for b, r in zip(self.conv_blocks, rows)]))
        elif name in ("A_log", "dt_bias"):
            getattr(self, name).data.copy_(self.head_block.rows_of(tensor, self.tp.rank))
        elif name == "norm.weight":
            self.norm.weight.data.copy_(tensor)
        elif name == "out_proj.weight":
            self.out_proj.load(tensor)
        else:
            raise KeyError(name)

    def _per_group(self, size: int) -> int:
        return self.full.num_v_heads // self.full.num_k_heads * size

    def _ungroup(self, tensor: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        """[Hk * sum(sizes), H] grouped by key head (whole checkpoint) -> one [Hk * size, H] block per part."""
        grouped = tensor.view(self.full.num_k_heads, sum(sizes), tensor.shape[-1])
        return [part.reshape(-1, tensor.shape[-1]) for part in grouped.split(sizes, dim=1)]


class KeptInputs:
    """The gated delta rule's inputs of a replayed verify step, in static buffers that the verify graphs copy
    into: q, k [T, Hk, K], v [T, Hv, V], a, b [T, Hv] of max_tokens rows (a graph's copies hold its shape's
    tokens, the step's real rows first)."""

    def __init__(self, spec: GDNSpec, max_tokens: int, dtype: torch.dtype, device: torch.device):
        def buf(*shape):
            return torch.zeros(max_tokens, *shape, dtype=dtype, device=device)

        self.q, self.k = buf(spec.num_k_heads, spec.head_k_dim), buf(spec.num_k_heads, spec.head_k_dim)
        self.v = buf(spec.num_v_heads, spec.head_v_dim)
        self.a, self.b = buf(spec.num_v_heads), buf(spec.num_v_heads)

    def keep(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
        n = q.shape[0]
        assert n <= self.q.shape[0], f"a verify step of {n} tokens; the kept inputs hold {self.q.shape[0]}"
        for dst, src in ((self.q, q), (self.k, k), (self.v, v), (self.a, a), (self.b, b)):
            dst[:n].copy_(src)
