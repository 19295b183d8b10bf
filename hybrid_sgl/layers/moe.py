"""Sparse MoE block: float32 router (softmax, top-k, optional renormalization), stacked experts,
and an optional shared expert scaled by sigmoid(shared_expert_gate x)."""

import re

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_sgl.config import MoESpec
from hybrid_sgl.layers.backends import MoEOps
from hybrid_sgl.layers.mlp import GatedMLP

_EXPERT = re.compile(r"experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")


class SparseMoE(nn.Module):
    def __init__(self, *, spec: MoESpec, hidden_size: int, ops: MoEOps):
        super().__init__()
        self.spec = spec
        self.ops = ops
        e, i = spec.num_experts, spec.intermediate_size
        self.router = nn.Parameter(torch.empty(e, hidden_size, dtype=torch.float32))
        self.w13 = nn.Parameter(torch.empty(e, 2 * i, hidden_size))  # [E, gate rows | up rows, H]
        self.w2 = nn.Parameter(torch.empty(e, hidden_size, i))
        self.shared = None
        self.shared_gate = None
        if spec.shared_expert_intermediate_size:
            self.shared = GatedMLP(hidden_size, spec.shared_expert_intermediate_size)
            if spec.shared_expert_gate:
                self.shared_gate = nn.Linear(hidden_size, 1, bias=False)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, H] -> (weights [T, k] float32, expert ids [T, k])."""
        probs = F.linear(x.float(), self.router).softmax(dim=-1)
        weights, ids = probs.topk(self.spec.top_k, dim=-1)
        if self.spec.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""
        weights, ids = self.route(x)
        out = self.ops.fused_moe(x=x, w13=self.w13, w2=self.w2, topk_weights=weights, topk_ids=ids)
        if self.shared is not None:
            shared = self.shared(x)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(x)) * shared
            out = out + shared
        return out

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """Checkpoint names: gate.weight, experts.{e}.{gate,up,down}_proj.weight or stacked
        experts.gate_up_proj [E, 2I, H] / experts.down_proj [E, H, I], shared_expert.*,
        shared_expert_gate.weight."""
        i = self.spec.intermediate_size
        if name == "gate.weight":
            self.router.data.copy_(tensor)
        elif m := _EXPERT.fullmatch(name):
            e, proj = int(m.group(1)), m.group(2)
            target = {"gate_proj": self.w13.data[e, :i], "up_proj": self.w13.data[e, i:],
                      "down_proj": self.w2.data[e]}[proj]
            target.copy_(tensor)
        elif name == "experts.gate_up_proj":
            self.w13.data.copy_(tensor)
        elif name == "experts.down_proj":
            self.w2.data.copy_(tensor)
        elif name.startswith("shared_expert.") and self.shared is not None:
            self.shared.load_weight(name.removeprefix("shared_expert."), tensor)
        elif name == "shared_expert_gate.weight" and self.shared_gate is not None:
            self.shared_gate.weight.data.copy_(tensor)
        else:
            raise KeyError(name)
