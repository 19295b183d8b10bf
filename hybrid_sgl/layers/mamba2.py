"""Mamba2 mixer (Nemotron-H, Falcon-H1, Granite-4.0-H, Bamba).

in_proj -> [z | xBC | dt]; causal conv1d (+ bias) + silu over xBC; split xBC into x [H, P],
B [G, N], C [G, N]; SSD scan (prefill) or SSM step (decode) with state in the pool slot;
then y = norm(y * silu(z)) by groups (or y * silu(z) when the config has no norm); out_proj.
"""

import torch
from torch import nn

from hybrid_sgl.config import Mamba2Spec
from hybrid_sgl.layers.backends import SSMOps
from hybrid_sgl.runner.forward_batch import ForwardBatch


class Mamba2Mixer(nn.Module):
    def __init__(self, *, spec: Mamba2Spec, hidden_size: int, eps: float, state_index: int, ops: SSMOps,
                 in_proj_scale: torch.Tensor | None = None):
        """in_proj_scale: optional per-channel multipliers of the in_proj output [sum(splits)]
        (Falcon-H1's ssm_multipliers), folded into the in_proj rows as they load."""
        super().__init__()
        self.spec = spec
        self.eps = eps
        self.state_index = state_index  # which state-pool layer is ours
        self.ops = ops
        s = spec
        self.splits = [s.intermediate_size, s.conv_dim, s.num_heads]  # z, xBC, dt
        self.in_proj = nn.Linear(hidden_size, sum(self.splits), bias=s.proj_bias)
        self.conv_weight = nn.Parameter(torch.empty(s.conv_dim, s.conv_kernel))
        self.conv_bias = nn.Parameter(torch.empty(s.conv_dim)) if s.conv_bias else None
        self.A_log = nn.Parameter(torch.empty(s.num_heads, dtype=torch.float32))
        self.D = nn.Parameter(torch.ones(s.num_heads, dtype=torch.float32))
        self.dt_bias = nn.Parameter(torch.ones(s.num_heads, dtype=torch.float32))
        self.norm_weight = nn.Parameter(torch.ones(s.intermediate_size)) if s.gated_norm else None
        self.out_proj = nn.Linear(s.intermediate_size, hidden_size, bias=s.out_bias)
        self.in_proj_scale = in_proj_scale

    @property
    def norm_group_size(self) -> int:
        s = self.spec
        return s.norm_group_size or s.intermediate_size // s.n_groups

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
            def core(cu_seqlens, state_slots, has_initial_state, xbc, dt, *zh):
                xbc = self.ops.conv_prefill(x=xbc, weight=self.conv_weight, bias=self.conv_bias,
                                            conv_states=conv_states, cu_seqlens=cu_seqlens, state_slots=state_slots,
                                            has_initial_state=has_initial_state)
                return self.ops.mamba2_prefill(**self._scan_inputs(xbc, dt, zh[0] if zh else None),
                                               ssm_states=ssm_states, state_slots=state_slots, cu_seqlens=cu_seqlens,
                                               has_initial_state=has_initial_state, chunk_size=s.chunk_size)

            y = fb.recurrent(self.state_index, core, xbc, dt, *([] if zh is None else [zh]))
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
        """y, z: [T, I] -> [T, I]."""
        g = self.norm_group_size
        if not self.spec.norm_before_gate:
            return self.ops.gate_rmsnorm(x=y, z=z, weight=self.norm_weight, eps=self.eps, group_size=g)
        t, i = y.shape  # norm first, then gate: rare (Falcon-H1 option), torch only
        yf = y.float().view(t, i // g, g)
        yf = (yf * torch.rsqrt(yf.pow(2).mean(-1, keepdim=True) + self.eps)).view(t, i).to(y.dtype)
        return (self.norm_weight * yf * torch.nn.functional.silu(z.float())).to(y.dtype)

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """Checkpoint names: in_proj.{weight,bias}, conv1d.weight [C, 1, W], conv1d.bias, A_log, D,
        dt_bias, norm.weight, out_proj.{weight,bias}."""
        if name == "conv1d.weight":
            self.conv_weight.data.copy_(tensor.reshape(self.conv_weight.shape))
        elif name == "conv1d.bias" and self.conv_bias is not None:
            self.conv_bias.data.copy_(tensor)
        elif name in ("A_log", "D", "dt_bias"):
            getattr(self, name).data.copy_(tensor)
        elif name == "norm.weight" and self.norm_weight is not None:
            self.norm_weight.data.copy_(tensor)
        elif name.partition(".")[0] in ("in_proj", "out_proj"):
            module, _, kind = name.partition(".")
            param = getattr(getattr(self, module), kind, None)
            if param is None:
                raise KeyError(name)
            if module == "in_proj" and self.in_proj_scale is not None:  # (m * W) x + m * b = m * (W x + b)
                scale = self.in_proj_scale.to(tensor.device, torch.float32)
                tensor = tensor.float() * (scale[:, None] if tensor.dim() == 2 else scale)
            param.data.copy_(tensor)
        else:
            raise KeyError(name)
