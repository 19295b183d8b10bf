"""Mamba2 mixer (Nemotron-H, Falcon-H1, Granite-4.0-H, Bamba).

in_proj -> [z | xBC | dt]; causal conv1d (+ bias) + silu over xBC; split xBC into x [H, P],
B [G, N], C [G, N]; SSD scan (prefill) or SSM step (decode) with state in the pool slot;
then y = norm(y * silu(z)) by groups (or y * silu(z) when the config has no norm); out_proj.

Tensor parallel: heads split over the ranks (z, x, dt rows, conv channels of x, A_log, D, dt_bias,
norm weight); B / C groups split, or replicated when n_groups is smaller than the ranks; out_proj is
row-parallel. The gated norm stays group-exact: when a norm group spans several ranks, their sums
of squares are gathered (one all-gather of [T, ranks]). `spec` holds this rank's heads and groups,
`full` the checkpoint's.
"""

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_sgl.batch import ForwardBatch
from hybrid_sgl.config import Mamba2Spec
from hybrid_sgl.distributed import current_tp
from hybrid_sgl.distributed.sharding import mamba2_splits
from hybrid_sgl.layers.backends import SSMOps
from hybrid_sgl.layers.linear import Block, ColumnParallelLinear, RowParallelLinear


class Mamba2Mixer(nn.Module):
    def __init__(self, *, spec: Mamba2Spec, hidden_size: int, eps: float, state_index: int, ops: SSMOps,
                 in_proj_scale: torch.Tensor | None = None):
        """in_proj_scale: optional per-channel multipliers of the in_proj output [sum(splits)]
        (Falcon-H1's ssm_multipliers), folded into the in_proj rows as they load."""
        super().__init__()
        self.tp = current_tp()
        heads, groups = mamba2_splits(spec, self.tp.size)
        self.full = spec
        self.norm_group = spec.norm_group_size or spec.intermediate_size // spec.n_groups  # channels, whole model
        self.spec = s = dataclasses.replace(spec, num_heads=heads.local, n_groups=groups.local,
                                            norm_group_size=self.norm_group)
        self.norm_ranks = _norm_ranks(spec, s.intermediate_size, self.norm_group)
        self.eps = eps
        self.state_index = state_index  # which state-pool layer is ours
        self.ops = ops
        self.splits = [s.intermediate_size, s.conv_dim, s.num_heads]  # z, xBC, dt
        self.conv_blocks = [Block("x", s.head_dim, heads), Block("B", s.state_size, groups),
                            Block("C", s.state_size, groups)]
        self.in_proj = ColumnParallelLinear(hidden_size, [Block("z", s.head_dim, heads), *self.conv_blocks,
                                                          Block("dt", 1, heads)], bias=s.proj_bias, ops=ops.dense)
        self.head_block, self.channel_block = Block("heads", 1, heads), Block("channels", s.head_dim, heads)
        self.conv_weight = nn.Parameter(torch.empty(s.conv_dim, s.conv_kernel))
        self.conv_bias = nn.Parameter(torch.empty(s.conv_dim)) if s.conv_bias else None
        self.A_log = nn.Parameter(torch.empty(s.num_heads, dtype=torch.float32))
        self.D = nn.Parameter(torch.ones(s.num_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.ones(s.num_heads, dtype=torch.float32))
        self.norm_weight = nn.Parameter(torch.ones(s.intermediate_size)) if s.gated_norm else None
        self.out_proj = RowParallelLinear(Block("out_proj", s.head_dim, heads), hidden_size, bias=s.out_bias,
                                          ops=ops.dense)
        self.in_proj_scale = in_proj_scale

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]."""
        s, t = self.spec, x.shape[0]
        z, xbc, dt = self.in_proj(x).split(self.splits, dim=-1)
        conv_states, ssm_states = fb.state_pool.layer(self.state_index)
        zh = None if s.gated_norm else z.view(t, s.num_heads, s.head_dim)
        if fb.is_decode:
            xbc = self.ops.conv_update(x=xbc, weight=self.conv_weight, bias=self.conv_bias, conv_states=conv_states,
                                       state_slots=fb.state_slots, pad_slot=fb.state_pool.pad_slot)
            y = self.ops.mamba2_decode(**self._scan_inputs(xbc, dt, zh), ssm_states=ssm_states,
                                       state_slots=fb.state_slots, pad_slot=fb.state_pool.pad_slot)
        else:
            def core(cu_seqlens, state_slots, has_initial_state, cuts, xbc, dt, *zh):
                xbc = self.ops.conv_prefill(x=xbc, weight=self.conv_weight, bias=self.conv_bias,
                                            conv_states=conv_states, cu_seqlens=cu_seqlens, state_slots=state_slots,
                                            has_initial_state=has_initial_state, **cuts)
                return self.ops.mamba2_prefill(**self._scan_inputs(xbc, dt, zh[0] if zh else None),
                                               ssm_states=ssm_states, state_slots=state_slots, cu_seqlens=cu_seqlens,
                                               has_initial_state=has_initial_state, chunk_size=s.chunk_size, **cuts)

            y = fb.recurrent(core, xbc, dt, *([] if zh is None else [zh]))
        y = y.view(t, s.intermediate_size)
        if s.gated_norm:
            y = self._gated_norm(y, z)
        return self.out_proj(y)

    def _scan_inputs(self, xbc: torch.Tensor, dt: torch.Tensor, z: torch.Tensor | None) -> dict:
        """Conv output [T, conv_dim] -> the scan's x [T, H, P], B and C [T, G, N] and parameters."""
        s, t = self.spec, xbc.shape[0]
        bc = s.n_groups * s.state_size
        xs, B, C = xbc.split([s.intermediate_size, bc, bc], dim=-1)
        return dict(x=xs.view(t, s.num_heads, s.head_dim), dt=dt, A_log=self.A_log,
                    B=B.view(t, s.n_groups, s.state_size), C=C.view(t, s.n_groups, s.state_size), D=self.D,
                    dt_bias=self.dt_bias, z=z, dt_limit=s.dt_limit)

    def _gated_norm(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y, z: [T, I] -> [T, I] (this rank's channels)."""
        g = self.norm_group
        if self.norm_ranks > 1:
            return self._gated_norm_across_ranks(y, z)
        if not self.spec.norm_before_gate:
            return self.ops.gate_rmsnorm(x=y, z=z, weight=self.norm_weight, eps=self.eps, group_size=g)
        t, i = y.shape  # norm first, then gate: rare (Falcon-H1 option), torch only
        yf = y.float().view(t, i // g, g)
        yf = (yf * torch.rsqrt(yf.pow(2).mean(-1, keepdim=True) + self.eps)).view(t, i).to(y.dtype)
        return (self.norm_weight * yf * torch.nn.functional.silu(z.float())).to(y.dtype)

    def _gated_norm_across_ranks(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """y, z: [T, I / ranks]; this rank's channels are part of a norm group spread over `norm_ranks`
        consecutive ranks: gather every rank's sum of squares [T, ranks] and add up the group's."""
        g = y.float() * F.silu(z.float())
        sums = self.tp.all_gather(g.pow(2).sum(-1, keepdim=True))  # [T, ranks]
        first = self.tp.rank // self.norm_ranks * self.norm_ranks
        variance = sums[:, first:first + self.norm_ranks].sum(-1, keepdim=True) / self.norm_group
        return (self.norm_weight * (g * torch.rsqrt(variance + self.eps)).to(y.dtype)).to(y.dtype)

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """Checkpoint names: in_proj.{weight,bias}, conv1d.weight [C, 1, W], conv1d.bias, A_log, D,
        dt_bias, norm.weight, out_proj.{weight,bias}."""
        f = self.full
        xbc = [f.intermediate_size, f.n_groups * f.state_size, f.n_groups * f.state_size]
        if name in ("conv1d.weight", "conv1d.bias") and (name == "conv1d.weight" or self.conv_bias is not None):
            rows = tensor.reshape(f.conv_dim, -1).split(xbc)
            part = torch.cat([b.rows_of(r, self.tp.rank) for b, r in zip(self.conv_blocks, rows)])
            param = self.conv_weight if name == "conv1d.weight" else self.conv_bias
            param.data.copy_(part.reshape(param.shape))
        elif name in ("A_log", "D", "dt_bias"):
            getattr(self, name).data.copy_(self.head_block.rows_of(tensor, self.tp.rank))
        elif name == "norm.weight" and self.norm_weight is not None:
            self.norm_weight.data.copy_(self.channel_block.rows_of(tensor, self.tp.rank))
        elif name in ("in_proj.weight", "in_proj.bias") and (name == "in_proj.weight" or f.proj_bias):
            if self.in_proj_scale is not None:  # (m * W) x + m * b = m * (W x + b)
                scale = self.in_proj_scale.to(tensor.device, torch.float32)
                tensor = tensor.float() * (scale[:, None] if tensor.dim() == 2 else scale)
            kind = name.partition(".")[2]
            for block, rows in zip(("z", "x", "B", "C", "dt"), tensor.split([f.intermediate_size, *xbc, f.num_heads])):
                self.in_proj.load(block, rows, kind)
        elif name in ("out_proj.weight", "out_proj.bias") and (name == "out_proj.weight" or f.out_bias):
            self.out_proj.load(tensor, name.partition(".")[2])
        else:
            raise KeyError(name)


def _norm_ranks(spec: Mamba2Spec, local_channels: int, group: int) -> int:
    """How many consecutive ranks one norm group of `group` channels spans (1: each rank's own)."""
    if not spec.gated_norm or group <= local_channels:
        if spec.gated_norm and local_channels % group:
            raise ValueError(f"the Mamba2 norm groups of {group} channels do not fit {local_channels} channels per "
                             "rank: choose a --tp-size that divides mamba n_groups (or --tp-size 1)")
        return 1
    if group % local_channels or spec.norm_before_gate:
        raise ValueError(f"a Mamba2 norm group of {group} channels cannot be spread over ranks of {local_channels} "
                         "channels here: choose a --tp-size that divides mamba n_groups (or --tp-size 1)")
    return group // local_channels
