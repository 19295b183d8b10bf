"""Kernel backends by registry: every choice between a Triton kernel and its torch reference is made
here, once, at start-up, and the modules receive the chosen functions at construction.

A backend is a frozen bundle of functions that share the keyword signatures of the torch
references in `triton_kernels/`. Factories import lazily; a backend whose import fails is
"unavailable". `auto` takes the first available backend in the device's preference order.

Each mixer kind's bundle (attention, linear attention, SSM, MoE) comes from its flag and the device,
and carries the DenseOps its layers run around their core (projections, norms, activations, the
attention's q/k prep and output gate): Triton's on CUDA unless the bundle is torch. What no flag
names (the layer norms, dense MLPs, the final norm) runs `Backends.dense`: Triton's when any bundle's
is. So `--linear-attn-backend torch` runs the GDN and Mamba mixers wholly in torch, and with every
flag torch no Triton kernel runs.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

from hybrid_sgl.config import ModelConfig


@dataclass(frozen=True)
class DenseOps:
    """What every layer kind runs around its core (layers/norm.py, linear.py, mlp.py, relu2_mlp.py,
    attention.py, quantization.py)."""

    name: str
    rmsnorm: Callable
    add_rmsnorm: Callable
    gated_rmsnorm: Callable
    silu_and_mul: Callable
    relu2: Callable
    qk_norm_rope: Callable  # q/k RMSNorm, then rotary, in one pass
    rope: Callable  # rotary of q and k (no norm), in one pass
    sigmoid_gate_mul: Callable
    linear: Callable  # 16-bit weights: (x, weight, bias) -> x @ weight^T + bias
    fp8_few_rows_gemm: Callable  # FP8 weights, decode rows: unquantized activations, or W8A8 where faster
    fp8_few_rows_gated_gemm: Callable  # the same, silu(gate) * up of a gated MLP's gate_up
    fp8_gemm: Callable  # FP8 weights and activations (more rows)


@dataclass(frozen=True)
class AttentionOps:
    name: str
    store_kv: Callable
    extend: Callable
    decode: Callable
    dense: DenseOps


@dataclass(frozen=True)
class LinearAttnOps:
    name: str
    conv_prefill: Callable
    conv_update: Callable
    gdn_prefill: Callable
    gdn_decode: Callable
    gdn_rows: Callable  # gdn_prefill's contract token by token, for short rows; skips pad-slot rows
    conv_rows: Callable  # conv_prefill's likewise
    dense: DenseOps


@dataclass(frozen=True)
class SSMOps:
    """Mamba2 / Mamba-1 mixers: conv1d (shared with GDN), decode steps and chunked prefill scans, and
    the gate-then-RMSNorm after the Mamba2 mixer."""

    name: str
    conv_prefill: Callable
    conv_update: Callable
    mamba2_prefill: Callable
    mamba2_decode: Callable
    mamba1_prefill: Callable
    mamba1_decode: Callable
    gate_rmsnorm: Callable
    dense: DenseOps


@dataclass(frozen=True)
class MoEOps:
    name: str
    route: Callable  # x, router -> (top-k weights, expert ids, router logits)
    fused_moe: Callable
    norm_route: Callable  # the block's pre-norm, then route: -> (weights, ids, logits, normed x, residual)
    dense: DenseOps  # the shared expert's
    sigmoid_topk: Callable  # Nemotron-H's router: sigmoid logits, correction bias, expert groups -> (weights, ids)


@dataclass(frozen=True)
class Backends:
    """A model's kernel bundles; a bundle the model does not use may be None."""

    attention: AttentionOps | None
    linear_attention: LinearAttnOps | None
    moe: MoEOps | None
    ssm: SSMOps | None = None

    @property
    def dense(self) -> DenseOps:
        """The dense ops of the parts no flag names (layer norms, dense MLPs, the final norm)."""
        bundles = (self.attention, self.linear_attention, self.moe, self.ssm)
        return next((b.dense for b in bundles if b is not None and b.dense.name != "torch"), dense_ops("torch"))

    def of_mixer(self, mixer: str) -> str:
        """Backend name(s) serving a layer-plan mixer kind, for the start-up report."""
        bundles = {"attention": self.attention, "linear_attention": self.linear_attention, "ssm": self.ssm}
        names = [bundles[kind].name for kind in MIXER_BUNDLES[mixer] if bundles[kind] is not None]
        return "+".join(names) or "-"


# layer-plan mixer kind -> the bundles its layers run
MIXER_BUNDLES = {"full_attention": ("attention",), "linear_attention": ("linear_attention",), "mamba2": ("ssm",),
                 "mamba": ("ssm",), "attention_mamba2": ("attention", "ssm"), "none": ()}


def _torch_dense() -> DenseOps:
    from triton_kernels import attention_prep as prep
    from triton_kernels import dense_linear as dl
    from triton_kernels import fp8_gemm, norms
    from triton_kernels import fp8_weight_only as wo

    return DenseOps("torch", norms.rmsnorm_ref, norms.add_rmsnorm_ref, norms.gated_rmsnorm_ref, norms.silu_and_mul_ref,
                    norms.relu2_ref, prep.qk_norm_rope_ref, prep.rope_ref, prep.sigmoid_gate_mul_ref,
                    dl.dense_linear_ref, wo.fp8_weight_only_gemm_ref, wo.fp8_weight_only_gated_gemm_ref,
                    fp8_gemm.fp8_gemm_ref)


def _triton_dense() -> DenseOps:
    from triton_kernels import attention_prep as prep
    from triton_kernels import dense_linear as dl
    from triton_kernels import fp8_few_rows as few
    from triton_kernels import fp8_gemm, norms

    return DenseOps("triton", norms.rmsnorm, norms.add_rmsnorm, norms.gated_rmsnorm, norms.silu_and_mul, norms.relu2,
                    prep.qk_norm_rope, prep.rope, prep.sigmoid_gate_mul, dl.dense_linear, few.fp8_few_rows_gemm,
                    few.fp8_few_rows_gated_gemm, fp8_gemm.fp8_gemm)


DENSE = {"torch": _torch_dense, "triton": _triton_dense}


@functools.cache
def dense_ops(name: str) -> DenseOps:
    return DENSE[name]()


def _dense_of(backend: str, device: str) -> DenseOps:
    """The dense ops of a bundle named `backend`: Triton's only on CUDA (on a CPU the Triton mixer kernels
    run in the interpreter, for tests, and their layers' dense parts stay torch)."""
    return dense_ops("triton" if backend != "torch" and device == "cuda" else "torch")


def _torch_attention(dense: DenseOps) -> AttentionOps:
    from triton_kernels import paged_attention as pa
    from triton_kernels import paged_decode as pd

    return AttentionOps("torch", pa.store_kv_ref, pa.paged_attention_extend_ref, pd.paged_attention_decode_ref, dense)


def _triton_attention(dense: DenseOps) -> AttentionOps:
    from triton_kernels import paged_attention as pa
    from triton_kernels import paged_decode as pd

    return AttentionOps("triton", pa.store_kv, pa.paged_attention_extend, pd.paged_attention_decode, dense)


def _vllm_attention(dense: DenseOps) -> AttentionOps:
    from triton_kernels import paged_attention as pa
    from triton_kernels import vllm_attention as va

    return AttentionOps("vllm", pa.store_kv, va.vllm_attention_extend, va.vllm_attention_decode, dense)


def _torch_linear_attn(dense: DenseOps) -> LinearAttnOps:
    from triton_kernels import causal_conv1d as conv
    from triton_kernels import gdn_chunk, gdn_recurrent
    from triton_kernels.gdn_short_rows import gdn_rows_ref

    return LinearAttnOps("torch", conv.causal_conv1d_prefill_ref, conv.causal_conv1d_update_ref,
                         gdn_chunk.gdn_prefill_ref, gdn_recurrent.gdn_decode_ref, gdn_rows_ref,
                         conv.causal_conv1d_rows_ref, dense)


def _triton_linear_attn(dense: DenseOps) -> LinearAttnOps:
    from triton_kernels import causal_conv1d as conv
    from triton_kernels import gdn_chunk, gdn_recurrent, gdn_short_rows

    return LinearAttnOps("triton", conv.causal_conv1d_prefill, conv.causal_conv1d_update,
                         gdn_chunk.gdn_prefill, gdn_recurrent.gdn_decode, gdn_short_rows.gdn_rows,
                         conv.causal_conv1d_rows, dense)


def _torch_ssm(dense: DenseOps) -> SSMOps:
    from triton_kernels import causal_conv1d as conv
    from triton_kernels import norms, selective_scan, ssd_chunk, ssm_step

    return SSMOps("torch", conv.causal_conv1d_prefill_ref, conv.causal_conv1d_update_ref,
                  ssd_chunk.mamba2_prefill_ref, ssm_step.mamba2_decode_ref, selective_scan.mamba1_prefill_ref,
                  ssm_step.mamba1_decode_ref, norms.gate_rmsnorm_ref, dense)


def _triton_ssm(dense: DenseOps) -> SSMOps:
    from triton_kernels import causal_conv1d as conv
    from triton_kernels import norms, selective_scan, ssd_chunk, ssm_step

    return SSMOps("triton", conv.causal_conv1d_prefill, conv.causal_conv1d_update, ssd_chunk.mamba2_prefill,
                  ssm_step.mamba2_decode, selective_scan.mamba1_prefill, ssm_step.mamba1_decode,
                  norms.gate_rmsnorm, dense)


def _torch_moe(dense: DenseOps) -> MoEOps:
    from triton_kernels import fused_moe, moe_routing, sigmoid_routing

    return MoEOps("torch", moe_routing.route_ref, fused_moe.fused_moe_ref, moe_routing.norm_route_ref, dense,
                  sigmoid_routing.sigmoid_topk_ref)


def _triton_moe(dense: DenseOps) -> MoEOps:
    from triton_kernels import fused_moe, moe_routing, sigmoid_routing

    return MoEOps("triton", moe_routing.route, fused_moe.fused_moe, moe_routing.norm_route, dense,
                  sigmoid_routing.sigmoid_topk)


REGISTRY: dict[str, dict[str, Callable]] = {
    "attention": {"torch": _torch_attention, "triton": _triton_attention, "vllm": _vllm_attention},
    "linear_attention": {"torch": _torch_linear_attn, "triton": _triton_linear_attn},
    "ssm": {"torch": _torch_ssm, "triton": _triton_ssm},
    "moe": {"torch": _torch_moe, "triton": _triton_moe},
}

PREFERENCE = {"cuda": ("triton", "torch"), "cpu": ("torch",)}
NEEDS_CUDA = {"triton", "vllm"}  # on a CPU only Triton's interpreter runs them (TRITON_INTERPRET=1, for tests)


def check_backend_device(flag: str, name: str, device: str) -> None:
    """Refuse at start-up a backend the device cannot run (it would fail every request later)."""
    if name in NEEDS_CUDA and device != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(f"{flag} {name} needs a CUDA GPU, and this server runs on {device}: "
                         f"use {flag} torch (or auto)")


def resolve_backend(kind: str, requested: str, device: str):
    """The ops bundle for `kind` ("attention", "linear_attention", "ssm", "moe"), with its dense ops."""
    factories = REGISTRY[kind]
    if requested != "auto":
        if requested not in factories:
            raise ValueError(f"unknown {kind} backend {requested!r}; choose from {sorted(factories)}")
        check_backend_device(f"{kind} backend", requested, device)
        try:
            return factories[requested](_dense_of(requested, device))
        except (ImportError, AttributeError) as e:
            raise ValueError(f"{kind} backend {requested!r} is not available here: {e}") from e
    for name in (n for n in PREFERENCE[device] if n in factories):
        try:
            return factories[name](_dense_of(name, device))
        except (ImportError, AttributeError):
            continue
    raise ValueError(f"no {kind} backend is available on {device}")


def resolve_backends(config: ModelConfig, device: str, *, attention: str, linear_attention: str,
                     moe: str) -> Backends:
    """The bundles `config`'s layer plan runs, from the --attention-backend, --linear-attn-backend (GDN and
    SSM mixers) and --moe-runner-backend values; a bundle the plan does not use is None (and need not exist here)."""
    used = {kind for mixer, _ in config.layer_plan for kind in MIXER_BUNDLES[mixer]}
    used |= {"moe"} if any(ffn == "moe" for _, ffn in config.layer_plan) else set()
    flags = {"attention": attention, "linear_attention": linear_attention, "ssm": linear_attention, "moe": moe}
    return Backends(**{kind: resolve_backend(kind, flag, device) if kind in used else None
                       for kind, flag in flags.items()})
