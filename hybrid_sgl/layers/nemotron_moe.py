"""Nemotron-H MoE block: float32 sigmoid router whose expert choice adds a score-correction bias
and first keeps the best `topk_group` of `n_group` expert groups (a group scores the sum of its two
best experts); the chosen experts are weighted by their uncorrected scores, optionally renormalized,
times `routed_scaling_factor`. Experts are non-gated relu2 MLPs, optionally run in a smaller latent
space (`moe_latent_size`); an ungated relu2 shared expert sees the block input.

Tensor parallel: every expert's intermediate dimension splits over the ranks; the routed experts'
partial outputs are all-reduced before the latent projection back (which, like the router and
the projection into the latent space, stays whole); the shared expert reduces its own."""

import re

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_sgl.config import MoESpec
from hybrid_sgl.distributed import current_tp
from hybrid_sgl.distributed.sharding import split_heads
from hybrid_sgl.layers.backends import MoEOps
from hybrid_sgl.layers.linear import Block
from hybrid_sgl.layers.quantization import QuantizableExperts, fp8_experts
from hybrid_sgl.layers.relu2_mlp import Relu2MLP

_EXPERT = re.compile(r"experts\.(\d+)\.(up_proj|down_proj)\.weight")


class NemotronMoE(nn.Module, QuantizableExperts):
    def __init__(self, *, spec: MoESpec, hidden_size: int, latent_size: int | None, bias: bool, ops: MoEOps):
        super().__init__()
        if spec.num_experts % spec.n_group or spec.num_experts // spec.n_group < 2:
            raise ValueError(f"{spec.num_experts} experts cannot form {spec.n_group} groups of at least 2")
        self.spec = spec
        self.ops = ops
        self.tp = current_tp()
        self.block = Block("experts", 1, split_heads(spec.intermediate_size, self.tp.size, "moe_intermediate_size"))
        e, i, d = spec.num_experts, self.block.local_rows, latent_size or hidden_size
        self.router = nn.Parameter(torch.empty(e, hidden_size, dtype=torch.float32))
        self.correction_bias = nn.Parameter(torch.empty(e, dtype=torch.float32))
        self.w_up = nn.Parameter(torch.empty(e, i, d))  # [E, I, D], D = latent or hidden size
        self.w_down = nn.Parameter(torch.empty(e, d, i))  # [E, D, I]
        self.register_buffer("w_up_scale_inv", None)  # FP8 experts' block scales (layers/quantization.py)
        self.register_buffer("w_down_scale_inv", None)
        self.to_latent = nn.Linear(hidden_size, latent_size, bias=bias) if latent_size else None
        self.from_latent = nn.Linear(latent_size, hidden_size, bias=bias) if latent_size else None
        shared = spec.shared_expert_intermediate_size
        self.shared = Relu2MLP(hidden_size, shared, bias, ops=ops.dense) if shared else None
        # the shared expert's output joins the experts' combine where nothing comes between them
        self.shared_in_combine = self.shared is not None and self.tp.size == 1 and self.from_latent is None

    def experts_to_fp8(self) -> None:
        self.w_up, self.w_up_scale_inv = fp8_experts(self.w_up)
        self.w_down, self.w_down_scale_inv = fp8_experts(self.w_down)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, H] -> (weights [T, k] float32, expert ids [T, k]): the router in float32, then
        triton_kernels/sigmoid_routing.py."""
        s = self.spec
        return self.ops.sigmoid_topk(logits=F.linear(x.float(), self.router), bias=self.correction_bias,
                                     top_k=s.top_k, groups=s.n_group, keep_groups=s.topk_group,
                                     renormalize=s.norm_topk_prob, scale=s.routed_scaling_factor)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H]. The shared expert's output is added in the experts' combine where nothing
        comes between (one rank, no latent space); else after the all-reduce and the latent projection."""
        weights, ids = self.route(x)
        h = x if self.to_latent is None else self.to_latent(x)
        out = self.ops.fused_moe(x=h, w13=self.w_up, w2=self.w_down, topk_weights=weights, topk_ids=ids,
                                 activation="relu2", w13_scale=self.w_up_scale_inv, w2_scale=self.w_down_scale_inv,
                                 shared=self.shared(x) if self.shared_in_combine else None)
        if self.tp.size > 1:
            out = self.tp.all_reduce(out)
        if self.from_latent is not None:
            out = self.from_latent(out)
        return out if self.shared is None or self.shared_in_combine else out + self.shared(x)

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """Checkpoint names: gate.weight, gate.e_score_correction_bias, experts.{e}.{up,down}_proj.weight
        or stacked experts.up_proj [E, I, D] / experts.down_proj [E, D, I], shared_experts.*,
        fc1_latent_proj.*, fc2_latent_proj.*."""
        module, _, rest = name.partition(".")
        if name == "gate.weight":
            self.router.data.copy_(tensor)
        elif name == "gate.e_score_correction_bias":
            self.correction_bias.data.copy_(tensor)
        elif m := _EXPERT.fullmatch(name):
            up = m.group(2) == "up_proj"
            (self.w_up if up else self.w_down).data[int(m.group(1))].copy_(
                self.block.rows_of(tensor, self.tp.rank, dim=0 if up else 1))
        elif name in ("experts.up_proj", "experts.down_proj"):  # [E, I, D] / [E, D, I]
            up = name == "experts.up_proj"
            (self.w_up if up else self.w_down).data.copy_(self.block.rows_of(tensor, self.tp.rank, dim=1 if up else 2))
        elif module == "shared_experts" and self.shared is not None:
            self.shared.load_weight(rest, tensor)
        elif module in ("fc1_latent_proj", "fc2_latent_proj") and self.to_latent is not None:
            linear = self.to_latent if module == "fc1_latent_proj" else self.from_latent
            param = getattr(linear, rest, None)
            if not isinstance(param, nn.Parameter):
                raise KeyError(name)
            param.data.copy_(tensor)
        else:
            raise KeyError(name)
