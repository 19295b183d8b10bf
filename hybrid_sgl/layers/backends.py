"""Kernel backends by registry.

A backend is a frozen bundle of functions that share the keyword signatures of the torch
references in `triton_kernels/`. Factories import lazily; a backend whose import fails is
"unavailable". `auto` takes the first available backend in the device's preference order.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionOps:
    name: str
    store_kv: Callable
    extend: Callable
    decode: Callable


@dataclass(frozen=True)
class LinearAttnOps:
    name: str
    conv_prefill: Callable
    conv_update: Callable
    gdn_prefill: Callable
    gdn_decode: Callable


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


@dataclass(frozen=True)
class MoEOps:
    name: str
    route: Callable  # x, router -> (top-k weights, expert ids, router logits)
    fused_moe: Callable
    norm_route: Callable  # the block's pre-norm, then route: -> (weights, ids, logits, normed x, residual)


def _torch_attention() -> AttentionOps:
    from triton_kernels import paged_attention as pa
    from triton_kernels import paged_decode as pd

    return AttentionOps("torch", pa.store_kv_ref, pa.paged_attention_extend_ref, pd.paged_attention_decode_ref)


def _triton_attention() -> AttentionOps:
    from triton_kernels import paged_attention as pa
    from triton_kernels import paged_decode as pd

    return AttentionOps("triton", pa.store_kv, pa.paged_attention_extend, pd.paged_attention_decode)


def _vllm_attention() -> AttentionOps:
    from triton_kernels import paged_attention as pa
    from triton_kernels import vllm_attention as va

    return AttentionOps("vllm", pa.store_kv, va.vllm_attention_extend, va.vllm_attention_decode)


def _torch_linear_attn() -> LinearAttnOps:
    from triton_kernels import causal_conv1d as conv
    from triton_kernels import gdn_chunk, gdn_recurrent

    return LinearAttnOps("torch", conv.causal_conv1d_prefill_ref, conv.causal_conv1d_update_ref,
                         gdn_chunk.gdn_prefill_ref, gdn_recurrent.gdn_decode_ref)


def _triton_linear_attn() -> LinearAttnOps:
    from triton_kernels import causal_conv1d as conv
    from triton_kernels import gdn_chunk, gdn_recurrent

    return LinearAttnOps("triton", conv.causal_conv1d_prefill, conv.causal_conv1d_update,
                         gdn_chunk.gdn_prefill, gdn_recurrent.gdn_decode)


def _torch_ssm() -> SSMOps:
    from triton_kernels import causal_conv1d as conv
    from triton_kernels import norms, selective_scan, ssd_chunk, ssm_step

    return SSMOps("torch", conv.causal_conv1d_prefill_ref, conv.causal_conv1d_update_ref,
                  ssd_chunk.mamba2_prefill_ref, ssm_step.mamba2_decode_ref, selective_scan.mamba1_prefill_ref,
                  ssm_step.mamba1_decode_ref, norms.gate_rmsnorm_ref)


def _triton_ssm() -> SSMOps:
    from triton_kernels import causal_conv1d as conv
    from triton_kernels import norms, selective_scan, ssd_chunk, ssm_step

    return SSMOps("triton", conv.causal_conv1d_prefill, conv.causal_conv1d_update, ssd_chunk.mamba2_prefill,
                  ssm_step.mamba2_decode, selective_scan.mamba1_prefill, ssm_step.mamba1_decode,
                  norms.gate_rmsnorm)


def _torch_moe() -> MoEOps:
    from triton_kernels import fused_moe, moe_routing

    return MoEOps("torch", moe_routing.route_ref, fused_moe.fused_moe_ref, moe_routing.norm_route_ref)


def _triton_moe() -> MoEOps:
    from triton_kernels import fused_moe, moe_routing

    return MoEOps("triton", moe_routing.route, fused_moe.fused_moe, moe_routing.norm_route)


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
    """The ops bundle for `kind` ("attention", "linear_attention", "ssm", "moe")."""
    factories = REGISTRY[kind]
    if requested != "auto":
        if requested not in factories:
            raise ValueError(f"unknown {kind} backend {requested!r}; choose from {sorted(factories)}")
        check_backend_device(f"{kind} backend", requested, device)
        try:
            return factories[requested]()
        except (ImportError, AttributeError) as e:
            raise ValueError(f"{kind} backend {requested!r} is not available here: {e}") from e
    for name in (n for n in PREFERENCE[device] if n in factories):
        try:
            return factories[name]()
        except (ImportError, AttributeError):
            continue
    raise ValueError(f"no {kind} backend is available on {device}")
