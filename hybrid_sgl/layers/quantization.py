"""FP8 weights: which checkpoints and flags are supported, how an FP8 checkpoint's tensors reach the
linear layers, the linear layer whose weight may turn FP8 (`QuantizableLinear`) and the GEMMs it calls.

Supported: the published block layout (DeepSeek-V3, Qwen3 FP8): `quantization_config` with
quant_method "fp8", fmt "e4m3", weight_block_size [128, 128], activation_scheme "dynamic"; each
quantized `X.weight` is float8_e4m3fn [N, K] with `X.weight_scale_inv` [ceil(N/128), ceil(K/128)]
beside it. `--quantization fp8` quantizes an unquantized checkpoint the same way at load.

Loading: the family code splits, fuses and shards checkpoint rows its own way, so an FP8 tensor
reaches it dequantized (float32, marked as `DequantizedFp8`, a mark that views and splits keep).
Routed MoE experts in FP8 load the same way into the MoE block's stacked weights, which stay in
--dtype (such checkpoints serve, without the FP8 memory saving for the experts) unless
--enable-fp8-experts turns them back into e4m3 blocks per expert (`quantize_experts`).
A linear layer notes whether every piece of its weight came marked; once all weights are in,
`quantize_linears` turns those layers (every one, for --quantization fp8) into e4m3 weights with
128 x 128 block scales over their own rows. Where a layer's blocks line up with the checkpoint's
(row offsets of fused parts and of tensor-parallel slices that are multiples of 128), this gives back
the checkpoint's e4m3 values; elsewhere it re-rounds once in e4m3.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from hybrid_sgl.layers.backends import DenseOps
from triton_kernels.fp8_quant import FP8_BLOCK, FP8_DTYPE, dequantize_fp8, quantize_fp8, quantize_fp8_stacked
from triton_kernels.fp8_weight_only import WEIGHT_ONLY_MAX_ROWS

logger = logging.getLogger(__name__)
SUPPORTED = ("quant_method 'fp8', fmt 'e4m3', weight_block_size [128, 128], activation_scheme 'dynamic'")


@dataclass(frozen=True)
class Fp8Config:
    """from_checkpoint: the checkpoint holds FP8 weights (else every linear layer is quantized at load).
    experts: the routed MoE experts are kept in FP8 too (--enable-fp8-experts)."""

    from_checkpoint: bool
    experts: bool = False


def check_quantization_config(quant: dict) -> None:
    """Raise ValueError naming the field when a checkpoint's quantization_config is not one we serve."""
    method = quant.get("quant_method")
    unsupported = None
    if method != "fp8":
        unsupported = f"quant_method {method!r}"
    elif quant.get("fmt", "e4m3") != "e4m3":
        unsupported = f"fmt {quant.get('fmt')!r}"
    elif quant.get("activation_scheme", "dynamic") != "dynamic":
        unsupported = f"activation_scheme {quant.get('activation_scheme')!r} (static activation scales)"
    elif quant.get("weight_block_size") is None:
        unsupported = "no weight_block_size (per-tensor FP8 scales)"
    elif list(quant["weight_block_size"]) != [FP8_BLOCK, FP8_BLOCK]:
        unsupported = f"weight_block_size {quant['weight_block_size']}"
    if unsupported:
        raise ValueError(f"quantization_config has {unsupported}, which is not supported; supported: {SUPPORTED}. "
                         "Serve the model's unquantized (bf16) release, optionally with --quantization fp8")


def fp8_config(quant: dict | None, flag: str | None, experts: bool = False) -> Fp8Config | None:
    """The FP8 setting from the checkpoint's quantization_config, --quantization and
    --enable-fp8-experts, as ServerArgs.resolved() checked them (None: unquantized)."""
    if not quant and flag != "fp8":
        return None
    return Fp8Config(from_checkpoint=bool(quant), experts=experts)


class DequantizedFp8(torch.Tensor):
    """A float32 tensor dequantized from the checkpoint's FP8 weight; views and splits stay marked."""


def came_from_fp8(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, DequantizedFp8)


def dequantized_weights(weights: Iterator[tuple[str, torch.Tensor]],
                        experts_in_fp8: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """Pair each e4m3 `X.weight` with its `X.weight_scale_inv` (in either order, in any shard) and yield
    `X.weight` dequantized [N, K] float32 and marked; every other tensor passes through.
    experts_in_fp8: the experts are quantized again after loading (no warning that they are not)."""
    weights_waiting: dict[str, torch.Tensor] = {}
    scales_waiting: dict[str, torch.Tensor] = {}
    expert = None  # the first FP8 expert weight, for the warning
    for name, tensor in weights:
        if expert is None and ".experts." in name and name.endswith(".weight_scale_inv"):
            expert = name.removesuffix("_scale_inv")
            if not experts_in_fp8:
                logger.warning("FP8 MoE experts (%s, ...) are served in --dtype, dequantized at load: the experts' "
                               "memory is not halved and their GEMMs run in --dtype (--enable-fp8-experts keeps "
                               "them in FP8)", expert)
        if name.endswith((".weight_scale", ".input_scale")):
            raise ValueError(f"{name}: per-tensor or static FP8 scales are not supported; supported: {SUPPORTED}")
        if name.endswith(".weight_scale_inv"):
            base = name.removesuffix("_scale_inv")
            if base in weights_waiting:
                yield base, _dequantized(base, weights_waiting.pop(base), tensor)
            else:
                scales_waiting[base] = tensor
        elif tensor.dtype == FP8_DTYPE:
            if name in scales_waiting:
                yield name, _dequantized(name, tensor, scales_waiting.pop(name))
            else:
                weights_waiting[name] = tensor
        else:
            yield name, tensor
    if weights_waiting or scales_waiting:
        name = next(iter(weights_waiting or scales_waiting))
        raise ValueError(f"{name} is float8 without its weight_scale_inv (or the other way round): the checkpoint is "
                         "incomplete; download it again")


def _dequantized(name: str, weight: torch.Tensor, scale: torch.Tensor) -> DequantizedFp8:
    if weight.dim() != 2:
        raise ValueError(f"{name}: float8 tensors of shape {tuple(weight.shape)} are not supported; supported: one 2-D "
                         f"[N, K] weight per linear layer (per expert for MoE experts), {SUPPORTED}")
    n, k = weight.shape
    expected = (-(-n // FP8_BLOCK), -(-k // FP8_BLOCK))
    if tuple(scale.shape) != expected:
        raise ValueError(f"{name}_scale_inv has shape {tuple(scale.shape)}; a [{n}, {k}] weight in 128x128 blocks "
                         f"needs {expected}")
    return dequantize_fp8(weight, scale.float()).as_subclass(DequantizedFp8)


class QuantizableLinear(nn.Linear):
    """nn.Linear whose weight may turn FP8 after loading, its matmuls those of `ops`. `loaded_fp8`: one entry
    per weight piece loaded, True where it came dequantized from an FP8 checkpoint tensor."""

    def __init__(self, in_features: int, out_features: int, bias: bool, ops: DenseOps):
        super().__init__(in_features, out_features, bias=bias)
        self.register_buffer("weight_scale_inv", None)  # [ceil(out/128), ceil(in/128)] float32 once FP8
        self.loaded_fp8: list[bool] = []
        self.ops = ops

    def note_loaded(self, tensor: torch.Tensor, kind: str) -> None:
        if kind == "weight":
            self.loaded_fp8.append(came_from_fp8(tensor))

    def to_fp8(self) -> None:
        """Quantize the loaded weight in 128 x 128 blocks of this rank's rows and columns."""
        weight, scale = quantize_fp8(self.weight.data)
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.weight_scale_inv = scale

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.weight_scale_inv is None:
            return self.ops.linear(x, self.weight, bias)
        return fp8_linear(x, self.weight, self.weight_scale_inv, bias, self.ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of this layer's output, whose rows are [gate; up] (a gated MLP's gate_up): x [T, in] ->
        [T, out / 2]. FP8 decode runs it as one GEMV with the activation in its epilogue."""
        if self.weight_scale_inv is not None:
            return fp8_gated_linear(x, self.weight, self.weight_scale_inv, self.bias, self.ops)
        return self.ops.silu_and_mul(gate_up=self(x))


class QuantizableExperts(abc.ABC):
    """An MoE block whose stacked expert weights can turn FP8 (--enable-fp8-experts)."""

    @abc.abstractmethod
    def experts_to_fp8(self) -> None:
        """Replace each stacked expert weight [E, N, K] by its e4m3 blocks (`fp8_experts`) and set the block
        scales beside it."""


def fp8_experts(weight: torch.Tensor) -> tuple[nn.Parameter, torch.Tensor]:
    """Stacked expert weights [E, N, K] -> (e4m3 weights, float32 scales [E, ceil(N/128), ceil(K/128)]),
    128 x 128 blocks per expert."""
    weight, scale = quantize_fp8_stacked(weight.data)
    return nn.Parameter(weight, requires_grad=False), scale


def quantize_linears(model: nn.Module, only_fp8_loaded: bool) -> int:
    """Turn the model's linear layers to FP8: those whose weight came all from FP8 checkpoint tensors
    (only_fp8_loaded), or every one (online quantization, dummy weights); returns how many were turned."""
    turned = mixed = 0
    for layer in model.modules():
        if not isinstance(layer, QuantizableLinear):
            continue
        pieces = layer.loaded_fp8
        if not only_fp8_loaded or (pieces and all(pieces)):
            layer.to_fp8()
            turned += 1
        elif any(pieces):
            mixed += 1
    if mixed:
        logger.warning("%d linear layer(s) fuse FP8 and unquantized checkpoint tensors; they stay in the model dtype",
                       mixed)
    return turned


def quantize_experts(model: nn.Module) -> int:
    """Turn every MoE block's stacked expert weights into e4m3 with 128 x 128 block scales per expert;
    returns how many blocks were turned. As for linear layers, blocks that line up with a checkpoint's give
    back its e4m3 values."""
    blocks = [block for block in model.modules() if isinstance(block, QuantizableExperts)]
    for block in blocks:
        block.experts_to_fp8()
    return len(blocks)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor, bias: torch.Tensor | None,
               ops: DenseOps) -> torch.Tensor:
    """x [..., K] -> [..., N]. Up to WEIGHT_ONLY_MAX_ROWS rows (decode) only the weight is FP8: the
    layer's time is its weight read, and unquantized activations keep greedy decoding close to the
    unquantized model (on CUDA, from a few dozen rows, W8A8 serves the shapes where it timed faster:
    triton_kernels/fp8_few_rows.py). More rows (prefill) quantize activations too and multiply on the FP8
    tensor cores."""
    rows = x.reshape(-1, x.shape[-1])
    op = ops.fp8_few_rows_gemm if rows.shape[0] <= WEIGHT_ONLY_MAX_ROWS else ops.fp8_gemm
    y = op(x=rows, weight=weight, weight_scale_inv=weight_scale_inv, bias=bias)
    return y.view(*x.shape[:-1], weight.shape[0])


def fp8_gated_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale_inv: torch.Tensor, bias: torch.Tensor | None,
                     ops: DenseOps) -> torch.Tensor:
    """silu(gate) * up of a gated MLP's FP8 gate_up (weight [2I, K], rows [gate; up]): x [..., K] -> [..., I].
    Up to WEIGHT_ONLY_MAX_ROWS rows the weight-only GEMV can take the activation as its epilogue."""
    rows = x.reshape(-1, x.shape[-1])
    if rows.shape[0] > WEIGHT_ONLY_MAX_ROWS:
        return ops.silu_and_mul(gate_up=fp8_linear(x, weight, weight_scale_inv, bias, ops))
    y = ops.fp8_few_rows_gated_gemm(x=rows, weight=weight, weight_scale_inv=weight_scale_inv, bias=bias)
    return y.view(*x.shape[:-1], weight.shape[0] // 2)
