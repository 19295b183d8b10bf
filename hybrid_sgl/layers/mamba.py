"""Mamba-1 mixer (selective scan), as in Jamba.

in_proj -> [x | z]; causal conv1d (+ bias) + silu over x; x_proj -> [dt | B | C] with RMSNorms
on each (Jamba's dt/b/c layernorms); dt_proj to the channels (its bias is the dt bias, added
with the softplus inside the scan); selective scan (prefill) or step (decode) with the state in
the pool slot, D skip and silu(z) gating fused; out_proj.

Tensor parallel: the inner channels split over the ranks (in_proj x and z rows, conv channels,
dt_proj rows, dt bias, A_log, D); x_proj is row-parallel (its all-reduce gives every rank the whole
dt, B and C, normed whole), out_proj too. `spec` holds this rank's channels, `full` the checkpoint's.
"""

import dataclasses

import torch
from torch import nn

from hybrid_sgl.batch import ForwardBatch
from hybrid_sgl.config import MambaSpec
from hybrid_sgl.distributed import current_tp
from hybrid_sgl.distributed.sharding import split_heads
from hybrid_sgl.layers.backends import SSMOps
from hybrid_sgl.layers.linear import Block, ColumnParallelLinear, RowParallelLinear
from hybrid_sgl.layers.norm import RMSNorm

# checkpoint name of each inner norm -> our module name
_INNER_NORMS = {"dt_layernorm": "dt_norm", "b_layernorm": "b_norm", "c_layernorm": "c_norm"}


class MambaMixer(nn.Module):
    def __init__(self, *, spec: MambaSpec, hidden_size: int, eps: float, state_index: int, ops: SSMOps):
        super().__init__()
        self.tp = current_tp()
        split = split_heads(spec.intermediate_size, self.tp.size, "mamba intermediate_size (mamba_expand x hidden)")
        self.channels = Block("channels", 1, split)
        self.full = spec
        self.spec = dataclasses.replace(spec, intermediate_size=split.local)
        self.state_index = state_index  # which state-pool layer is ours
        self.ops = ops
        i, n, r = split.local, spec.state_size, spec.dt_rank
        dense = ops.dense
        self.in_proj = ColumnParallelLinear(hidden_size, [Block("x", 1, split), Block("z", 1, split)],
                                            bias=spec.proj_bias, ops=dense)  # [x | z]
        self.conv_weight = nn.Parameter(torch.empty(i, spec.conv_kernel))
        self.conv_bias = nn.Parameter(torch.empty(i)) if spec.conv_bias else None
        self.x_proj = RowParallelLinear(Block("x_proj", 1, split), r + 2 * n, ops=dense)  # [dt | B | C]
        self.dt_proj = ColumnParallelLinear(r, [Block("dt_proj", 1, split)], ops=dense)
        self.dt_bias = nn.Parameter(torch.empty(i, dtype=torch.float32))
        self.A_log = nn.Parameter(torch.empty(i, n, dtype=torch.float32))
        self.D = nn.Parameter(torch.ones(i, dtype=torch.float32))
        self.dt_norm = RMSNorm(r, eps, ops=dense) if spec.inner_norms else None
        self.b_norm = RMSNorm(n, eps, ops=dense) if spec.inner_norms else None
        self.c_norm = RMSNorm(n, eps, ops=dense) if spec.inner_norms else None
        self.out_proj = RowParallelLinear(Block("out_proj", 1, split), hidden_size, bias=spec.proj_bias, ops=dense)

    def forward(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """x: [T, hidden] -> [T, hidden]."""
        xs, z = self.in_proj(x).chunk(2, dim=-1)  # [T, I] each
        conv_states, ssm_states = fb.state_pool.layer(self.state_index)
        if fb.is_decode:
            xs = self.ops.conv_update(x=xs, weight=self.conv_weight, bias=self.conv_bias, conv_states=conv_states,
                                      state_slots=fb.state_slots, pad_slot=fb.state_pool.pad_slot)
            y = self.ops.mamba1_decode(**self._scan_inputs(xs, z), ssm_states=ssm_states, state_slots=fb.state_slots,
                                       pad_slot=fb.state_pool.pad_slot)
        else:
            def core(cu_seqlens, state_slots, has_initial_state, cuts, xs, z):
                xs = self.ops.conv_prefill(x=xs, weight=self.conv_weight, bias=self.conv_bias, conv_states=conv_states,
                                           cu_seqlens=cu_seqlens, state_slots=state_slots,
                                           has_initial_state=has_initial_state, **cuts)
                return self.ops.mamba1_prefill(**self._scan_inputs(xs, z), ssm_states=ssm_states,
                                               state_slots=state_slots, cu_seqlens=cu_seqlens,
                                               has_initial_state=has_initial_state, **cuts)

            y = fb.recurrent(core, xs, z)
        return self.out_proj(y)  # y: [T, I]

    def _scan_inputs(self, xs: torch.Tensor, z: torch.Tensor) -> dict:
        """Conv output xs [T, I] and gate z [T, I] -> the selective scan's inputs."""
        s = self.spec
        dt, B, C = self.x_proj(xs).split([s.dt_rank, s.state_size, s.state_size], dim=-1)
        if s.inner_norms:
            dt, B, C = self.dt_norm(dt), self.b_norm(B), self.c_norm(C)
        return dict(x=xs, dt=self.dt_proj(dt), A_log=self.A_log, B=B, C=C, D=self.D, dt_bias=self.dt_bias, z=z)

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """Checkpoint names: in_proj.{weight,bias}, conv1d.weight [I, 1, W], conv1d.bias, x_proj.weight,
        dt_proj.weight, dt_proj.bias, A_log [I, N], D, {dt,b,c}_layernorm.weight, out_proj.{weight,bias}."""
        module, _, kind = name.partition(".")
        rank = self.tp.rank
        if name == "conv1d.weight":
            self.conv_weight.data.copy_(self.channels.rows_of(tensor.reshape(self.full.intermediate_size, -1), rank))
        elif name == "conv1d.bias" and self.conv_bias is not None:
            self.conv_bias.data.copy_(self.channels.rows_of(tensor, rank))
        elif name in ("dt_proj.bias", "A_log", "D"):
            param = self.dt_bias if name == "dt_proj.bias" else getattr(self, name)
            param.data.copy_(self.channels.rows_of(tensor, rank))
        elif module in _INNER_NORMS and kind == "weight" and self.spec.inner_norms:
            getattr(self, _INNER_NORMS[module]).weight.data.copy_(tensor)
        elif module in ("in_proj", "x_proj", "dt_proj", "out_proj") and kind in ("weight", "bias"):
            if getattr(getattr(self, module), kind) is None:
                raise KeyError(name)
            if module == "in_proj":
                x, z = tensor.chunk(2, dim=0)
                self.in_proj.load("x", x, kind)
                self.in_proj.load("z", z, kind)
            elif module == "dt_proj":
                self.dt_proj.load("dt_proj", tensor, kind)
            else:
                getattr(self, module).load(tensor, kind)
        else:
            raise KeyError(name)
