"""Sparse MoE block: float32 router (softmax, top-k, optional renormalization), stacked experts,
and an optional shared expert scaled by sigmoid(shared_expert_gate x).

The shared expert's gate is one more row of the float32 router matrix, so one matmul gives the
expert logits and the gate logit. A shared expert as wide as the routed ones is stacked after them
(expert E of w13 / w2) and routed to every token as one more slot weighted sigmoid(gate) (or 1): the
fused MoE then reads it in the same two GEMM launches, where a separate MLP took three or four
kernels per layer at decode. A shared expert of another width runs as its own MLP, and the fused
MoE's combine adds it.

Tensor parallel: every expert's intermediate dimension splits over the ranks (w13 rows, w2
columns), the shared expert's too; the router stays whole; one all-reduce sums the ranks' partial
outputs (routed and shared together). With --ep-size (= --tp-size), each rank holds E / size whole
experts instead (rank r: experts r * E / size onwards); a slot routed to another rank's expert adds
nothing here, and the same all-reduce sums the ranks' parts. The shared expert stays split (and
unstacked)."""

import re

import torch
from torch import nn

from hybrid_sgl.config import MoESpec
from hybrid_sgl.distributed import current_tp
from hybrid_sgl.distributed.sharding import split_heads
from hybrid_sgl.layers.backends import MoEOps
from hybrid_sgl.layers.decoder_layer import FFN
from hybrid_sgl.layers.linear import Block, whole
from hybrid_sgl.layers.mlp import GatedMLP
from hybrid_sgl.layers.quantization import QuantizableExperts, fp8_experts

_EXPERT = re.compile(r"experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")
_SHARED = re.compile(r"shared_expert\.(gate_proj|up_proj|down_proj)\.weight")


class SparseMoE(FFN, QuantizableExperts):
    def __init__(self, *, spec: MoESpec, hidden_size: int, ops: MoEOps):
        super().__init__()
        self.spec = spec
        self.ops = ops
        self.tp = current_tp()
        if self.tp.expert_parallel:  # whole experts, E / size of them
            self.block = whole("experts", spec.intermediate_size, self.tp.size)
            self.num_local = spec.num_experts // self.tp.size
        else:
            self.block = Block("experts", 1, split_heads(spec.intermediate_size, self.tp.size, "moe_intermediate_size"))
            self.num_local = spec.num_experts
        self.first_expert = self.tp.rank * self.num_local if self.tp.expert_parallel else 0
        e, i = self.num_local, self.block.local_rows
        shared_size = spec.shared_expert_intermediate_size
        # the shared expert as expert num_local of the stack (its rows split over ranks as the experts' are)
        self.stacked_shared = bool(shared_size) and shared_size == spec.intermediate_size \
            and not self.tp.expert_parallel
        self.shared = GatedMLP(hidden_size, shared_size, reduce=False, ops=ops.dense) \
            if shared_size and not self.stacked_shared else None
        self.has_shared_gate = bool(shared_size) and spec.shared_expert_gate
        e += self.stacked_shared
        # [E experts | shared expert gate, H]
        self.router = nn.Parameter(torch.empty(spec.num_experts + self.has_shared_gate, hidden_size,
                                               dtype=torch.float32))
        self.w13 = nn.Parameter(torch.empty(e, 2 * i, hidden_size))  # [E, gate rows | up rows, H]
        self.w2 = nn.Parameter(torch.empty(e, hidden_size, i))
        self.register_buffer("w13_scale_inv", None)  # FP8 experts' block scales (layers/quantization.py)
        self.register_buffer("w2_scale_inv", None)

    def experts_to_fp8(self) -> None:
        self.w13, self.w13_scale_inv = fp8_experts(self.w13)
        self.w2, self.w2_scale_inv = fp8_experts(self.w2)

    def _route_args(self) -> dict:
        return dict(weight=self.router, top_k=self.spec.top_k, renormalize=self.spec.norm_topk_prob,
                    num_experts=self.spec.num_experts, shared_id=self.num_local if self.stacked_shared else None,
                    shared_gate=self.stacked_shared and self.has_shared_gate)

    def _gate(self, logits: torch.Tensor) -> torch.Tensor | None:
        """The unstacked shared expert's gate logits [T] (column E of the router logits), else None."""
        return logits[:, self.spec.num_experts] if self.has_shared_gate and not self.stacked_shared else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x: [T, H] -> (weights [T, k] float32, expert ids [T, k], shared gate logits [T] or None). With
        the shared expert stacked, its slot is one more column, k + 1 (id num_local), and no gate is returned."""
        weights, ids, logits = self.ops.route(x=x, **self._route_args())  # logits [T, E (+ 1)]
        return weights, ids, self._gate(logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H]."""
        return self._experts(x, *self.route(x))

    def add_norm_forward(self, x: torch.Tensor, residual: torch.Tensor, norm: nn.Module
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """The block behind its pre-norm: x (the delta), residual: [T, H] -> (forward(norm(x + residual)),
        x + residual). norm: the layer's RMSNorm; at decode the add and norm run in the router's launch."""
        weights, ids, logits, h, residual = self.ops.norm_route(x=x, residual=residual, norm_weight=norm.weight,
                                                                eps=norm.eps, offset=norm.offset, **self._route_args())
        return self._experts(h, weights, ids, self._gate(logits)), residual

    def _experts(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate: torch.Tensor | None
                 ) -> torch.Tensor:
        """x: [T, H] with its routing -> the routed and shared experts' sum [T, H], reduced over the ranks."""
        partial = self.tp.expert_parallel
        if partial:  # this rank's experts as 0 .. num_local - 1; the others' as num_local (skipped)
            ids = ids - self.first_expert
            ids = torch.where((ids >= 0) & (ids < self.num_local), ids, self.num_local)
        out = self.ops.fused_moe(x=x, w13=self.w13, w2=self.w2, topk_weights=weights, topk_ids=ids,
                                 shared=None if self.shared is None else self.shared(x), shared_gate=gate,
                                 partial=partial, w13_scale=self.w13_scale_inv, w2_scale=self.w2_scale_inv)
        return out if self.tp.size == 1 else self.tp.all_reduce(out)

    def load_weight(self, name: str, tensor: torch.Tensor) -> None:
        """Checkpoint names: gate.weight, experts.{e}.{gate,up,down}_proj.weight or stacked
        experts.gate_up_proj [E, 2I, H] / experts.down_proj [E, H, I], shared_expert.*,
        shared_expert_gate.weight."""
        rank, rows_of, local = self.tp.rank, self.block.rows_of, slice(0, self.num_local)
        if name == "gate.weight":
            self.router.data[: self.spec.num_experts].copy_(tensor)
        elif m := _EXPERT.fullmatch(name):
            e = int(m.group(1)) - self.first_expert
            if 0 <= e < self.num_local:  # else another rank's expert
                self._load_expert(e, m.group(2), tensor)
        elif name == "experts.gate_up_proj":  # [E, 2I, H]
            gate, up = tensor.narrow(0, self.first_expert, self.num_local).chunk(2, dim=1)
            self.w13.data[local].copy_(torch.cat([rows_of(gate, rank, dim=1), rows_of(up, rank, dim=1)], dim=1))
        elif name == "experts.down_proj":  # [E, H, I]
            self.w2.data[local].copy_(rows_of(tensor.narrow(0, self.first_expert, self.num_local), rank, dim=2))
        elif (m := _SHARED.fullmatch(name)) and self.stacked_shared:
            self._load_expert(self.num_local, m.group(1), tensor)
        elif name.startswith("shared_expert.") and self.shared is not None:
            self.shared.load_weight(name.removeprefix("shared_expert."), tensor)
        elif name == "shared_expert_gate.weight" and self.has_shared_gate:
            self.router.data[self.spec.num_experts :].copy_(tensor)
        else:
            raise KeyError(name)

    def _load_expert(self, e: int, proj: str, tensor: torch.Tensor) -> None:
        """proj (gate_proj, up_proj or down_proj) of local expert e (num_local: the stacked shared expert)."""
        i, rows_of, rank = self.block.local_rows, self.block.rows_of, self.tp.rank
        targets = {"gate_proj": self.w13.data[e, :i], "up_proj": self.w13.data[e, i:], "down_proj": self.w2.data[e]}
        targets[proj].copy_(rows_of(tensor, rank, dim=1 if proj == "down_proj" else 0))
