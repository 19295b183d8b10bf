"""Hardware ceilings measured in the run, and what one step of a model must move and compute.

Ceilings: device-to-device copy bandwidth (bytes read + written per second, 1 GiB copy) and the
bf16 matmul rate (8192^3); on CPU a 64 MiB copy and a float32 512^3 matmul.

Bytes one decode step must move (`ModelCost.decode_bytes`):
- every weight once, except the embedding table (only the batch's rows are read; a tied table is
  read by the LM head and counted there) and the routed experts, of which only the distinct
  experts the batch's tokens pick are read: E * (1 - (1 - k/E)^B) per MoE layer under uniform
  routing (k experts for one token, all E once B*k >> E);
- the KV of every live token (and the one written for each new token);
- every request's recurrent state (conv + SSM), read and written.
Activations and logits are not counted.

FLOPs of a step (`ModelCost.flops`): 2 * (matmul weights outside the embedding, the LM head and the
routed experts) per new token, 2 * top_k experts per token per MoE layer, the LM head for the rows
whose logits are computed, and 4 * heads * head_dim per causal (query, key) pair in each attention
layer. Linear-attention and SSM scan FLOPs are not counted (about 1 % of the matmuls).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Ceilings:
    device_name: str
    copy_bytes_per_s: float  # bytes read + written per second
    matmul_flops_per_s: float
    matmul_shape: str

    def to_dict(self) -> dict:
        return asdict(self)


def measure_ceilings(device: torch.device) -> Ceilings:
    if device.type == "cuda":
        import triton.testing

        bench = lambda fn: triton.testing.do_bench(fn, return_mode="median") * 1e-3  # noqa: E731
        copy_bytes, n, dtype, name = 1 << 30, 8192, torch.bfloat16, torch.cuda.get_device_name(device)
    else:
        bench = _cpu_median_s
        copy_bytes, n, dtype, name = 1 << 26, 512, torch.float32, "cpu"
    copy_s = _copy_s(bench, copy_bytes, device)
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    mm_s = bench(lambda: a @ b)
    return Ceilings(device_name=name, copy_bytes_per_s=2 * copy_bytes / copy_s,
                    matmul_flops_per_s=2 * n**3 / mm_s, matmul_shape=f"{n}^3 {str(dtype).removeprefix('torch.')}")


def _copy_s(bench, num_bytes: int, device: torch.device) -> float:
    x = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    return bench(lambda: y.copy_(x))


def _cpu_median_s(fn, reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[reps // 2]


@dataclass(frozen=True)
class ModelCost:
    total_params: int
    weight_bytes: int  # all parameters as stored
    dense_read_bytes: int  # read every decode step: all but the embedding table and the routed experts
    expert_bytes: int  # one routed expert of one MoE layer (0 without MoE)
    moe_layers: int
    num_experts: int
    top_k: int
    dense_matmul_params: int  # per-token matmul weights outside embedding, LM head and routed experts
    expert_params: int  # one routed expert
    lm_head_params: int
    attn_layers: int
    attn_heads: int
    attn_head_dim: int
    kv_bytes_per_token: int  # all attention layers, from the engine's memory plan
    state_bytes_per_request: int  # all recurrent layers, from the engine's memory plan

    @property
    def active_params(self) -> int:
        """Parameters one token uses (embedding row and LM head excluded)."""
        return self.dense_matmul_params + self.moe_layers * self.top_k * self.expert_params

    def distinct_experts(self, tokens: int) -> float:
        if not self.moe_layers:
            return 0.0
        e, k = self.num_experts, self.top_k
        return e * (1.0 - (1.0 - k / e) ** tokens)

    def decode_bytes(self, batch: int, context_tokens: int) -> float:
        """Bytes a decode step of `batch` requests with `context_tokens` live tokens (sum of their
        lengths after the step) must read and write."""
        weights = self.dense_read_bytes + self.moe_layers * self.distinct_experts(batch) * self.expert_bytes
        kv = self.kv_bytes_per_token * (context_tokens + batch)
        return weights + kv + 2 * self.state_bytes_per_request * batch

    def flops(self, new_tokens: int, attn_pairs: int, logit_rows: int) -> float:
        matmul = 2 * self.active_params * new_tokens + 2 * self.lm_head_params * logit_rows
        return matmul + 4 * self.attn_layers * self.attn_heads * self.attn_head_dim * attn_pairs

    def to_dict(self) -> dict:
        return {**asdict(self), "active_params": self.active_params}


def model_cost(model: torch.nn.Module, config, plan) -> ModelCost:
    """Cost model of a built hybrid_sgl model. Routed experts are the 3-D parameters whose leading
    dimension is the number of experts (stacked [E, ...] tensors)."""
    params = dict(model.named_parameters())  # a tied embedding / LM head appears once
    embed_ids = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    lm_head = model.lm_head.weight
    moe = config.moe
    moe_layers = sum(1 for _, ffn in config.layer_plan if ffn == "moe")
    # [E, ...], or [E + 1, ...] with a stacked shared expert last (layers/moe.py), which every token reads
    experts = [p for p in params.values() if moe and p.dim() == 3 and p.shape[0] in (moe.num_experts,
                                                                                   moe.num_experts + 1)]
    if moe_layers and not experts:
        raise ValueError("the config has MoE layers but no stacked [num_experts, ...] parameters were found; "
                         "the cost model cannot tell routed experts from dense weights")
    routed = [p[: moe.num_experts] for p in experts]
    stacked_shared = [p[moe.num_experts:] for p in experts]
    expert_numel = sum(p.numel() for p in routed)
    expert_bytes = sum(p.numel() * p.element_size() for p in routed)
    weight_bytes = sum(p.numel() * p.element_size() for p in params.values())
    embed_bytes = sum(p.numel() * p.element_size() for p in params.values()
                      if id(p) in embed_ids and p is not lm_head)
    expert_set = {id(p) for p in experts}
    dense_matmul = sum(p.numel() for p in params.values()
                       if p.dim() == 2 and id(p) not in embed_ids and p is not lm_head and id(p) not in expert_set)
    dense_matmul += sum(p.numel() for p in stacked_shared)
    per_expert = moe_layers * moe.num_experts if moe_layers else 1
    attn = config.attention
    return ModelCost(
        total_params=sum(p.numel() for p in params.values()), weight_bytes=weight_bytes,
        dense_read_bytes=weight_bytes - expert_bytes - embed_bytes,
        expert_bytes=expert_bytes // per_expert if moe_layers else 0, moe_layers=moe_layers,
        num_experts=moe.num_experts if moe else 0, top_k=moe.top_k if moe else 0,
        dense_matmul_params=dense_matmul, expert_params=expert_numel // per_expert if moe_layers else 0,
        lm_head_params=lm_head.numel(), attn_layers=len(config.kv_layers), attn_heads=attn.num_heads,
        attn_head_dim=attn.head_dim, kv_bytes_per_token=plan.kv_bytes_per_token,
        state_bytes_per_request=plan.state_bytes_per_request)
