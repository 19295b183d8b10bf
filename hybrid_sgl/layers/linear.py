"""Tensor-parallel linear layers: a family file declares how a weight splits, the layer slices.

A fused weight's output rows are a list of `Block`s (q, k, v, gate, up, ...), each made of
equal heads; rank r keeps the heads `split.first(r)` onwards of every block, packed in block
order. `load(block, tensor)` takes the block's full checkpoint tensor and copies rank r's rows.

- ColumnParallelLinear: output rows split by blocks; the input is whole; no communication.
- RowParallelLinear: input columns split by one block's heads; one all-reduce sums the ranks'
  partial outputs (the bias is added once, after it).
- ReplicatedLinear: every rank holds the whole weight (routers, small projections).
- VocabParallelEmbedding / ParallelLMHead: vocabulary rows split; lookups all-reduced, logits
  all-gathered.

At tp size 1 every block is whole and these are plain nn.Linear / nn.Embedding.

At decode sizes a 16-bit linear runs cuBLAS or our few-rows kernel, whichever timed faster for its
shape (`dense_linear`).

Column and row linears may hold FP8 weights (layers/quantization.py): `to_fp8()` after loading makes
the weight e4m3 [out, in] with `weight_scale_inv` [ceil(out/128), ceil(in/128)], and the layer's
matmul becomes the block-scaled FP8 GEMM. The families never see the difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
from torch import nn

from hybrid_sgl.distributed import current_tp
from hybrid_sgl.distributed.sharding import HeadSplit, replicated, vocab_split
from hybrid_sgl.layers.quantization import came_from_fp8, fp8_gated_linear, fp8_linear
from triton_kernels.fastest import chosen, fastest
from triton_kernels.fp8_quant import quantize_fp8
from triton_kernels.fp8_weight_only import DENSE_MAX_ROWS, dense_few_rows_gemm
from triton_kernels.norms import silu_and_mul, silu_and_mul_ref


@dataclass(frozen=True)
class Block:
    """`split.total` heads of `head_size` rows each in the checkpoint; `name` is what load() is called with."""

    name: str
    head_size: int
    split: HeadSplit

    @property
    def local_rows(self) -> int:
        return self.split.local * self.head_size

    def rows_of(self, tensor: torch.Tensor, rank: int, dim: int = 0) -> torch.Tensor:
        """Rank `rank`'s slice along `dim` of this block's full tensor."""
        assert tensor.shape[dim] == self.split.total * self.head_size, \
            f"{self.name}: {tuple(tensor.shape)} has no {self.split.total} x {self.head_size} rows in dim {dim}"
        return tensor.narrow(dim, self.split.first(rank) * self.head_size, self.local_rows)


def whole(name: str, rows: int, size: int) -> Block:
    """A block every rank keeps whole."""
    return Block(name, rows, replicated(size))


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear (x [..., K], weight [N, K] -> [..., N]). At decode sizes on CUDA (up to DENSE_MAX_ROWS rows,
    16-bit) it runs whichever of cuBLAS and our tensor-core kernel ran the shape faster (by 5 %), timed
    once per row bucket (the next power of two) at the bucket's rows (triton_kernels/fastest.py): the
    decode graphs' warm-ups time every bucket, so a short prefill later finds its answer instead of
    stalling. cuBLAS streams some narrow weights (few columns, long K) at a third of the bandwidth."""
    rows = x.reshape(-1, x.shape[-1])
    if not (x.is_cuda and 0 < rows.shape[0] <= DENSE_MAX_ROWS and x.dtype in (torch.bfloat16, torch.float16)
            and weight.dtype == x.dtype and _ours_is_faster(rows, weight, bias)):
        return F.linear(x, weight, bias)
    return dense_few_rows_gemm(x=rows, weight=weight, bias=bias).view(*x.shape[:-1], weight.shape[0])


def dense_linear_choice(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> str | None:
    """"cublas" or "ours" once dense_linear has timed x's shape and row bucket, else None."""
    return chosen(_choice_key(x.reshape(-1, x.shape[-1]), weight, bias))


def _choice_key(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple:
    return ("dense_linear", *weight.shape, triton.next_power_of_2(rows.shape[0]), rows.dtype, rows.device,
            bias is not None)


def _ours_is_faster(rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    def runs() -> dict:  # on random rows of the bucket's count
        x = torch.randn(triton.next_power_of_2(rows.shape[0]), rows.shape[1], dtype=rows.dtype, device=rows.device)
        return {"cublas": lambda: F.linear(x, weight, bias),
                "ours": lambda: dense_few_rows_gemm(x=x, weight=weight, bias=bias)}

    return fastest(_choice_key(rows, weight, bias), runs, margin=0.95) == "ours"


class QuantizableLinear(nn.Linear):
    """nn.Linear whose weight may turn FP8 after loading. `loaded_fp8`: one entry per weight piece
    loaded, True where it came dequantized from an FP8 checkpoint tensor."""

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__(in_features, out_features, bias=bias)
        self.register_buffer("weight_scale_inv", None)  # [ceil(out/128), ceil(in/128)] float32 once FP8
        self.loaded_fp8: list[bool] = []

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
            return dense_linear(x, self.weight, bias)
        return fp8_linear(x, self.weight, self.weight_scale_inv, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of this layer's output, whose rows are [gate; up] (a gated MLP's gate_up): x [T, in] ->
        [T, out / 2]. FP8 decode runs it as one GEMV with the activation in its epilogue."""
        if self.weight_scale_inv is not None:
            y = fp8_gated_linear(x, self.weight, self.weight_scale_inv, self.bias)
            if y is not None:
                return y
        gate_up = self(x)
        return silu_and_mul(gate_up=gate_up) if x.is_cuda else silu_and_mul_ref(gate_up=gate_up)


class ColumnParallelLinear(QuantizableLinear):
    """x [T, in] -> [T, sum of the blocks' local rows]."""

    def __init__(self, in_features: int, blocks: list[Block], bias: bool = False):
        super().__init__(in_features, sum(b.local_rows for b in blocks), bias=bias)
        self.tp = current_tp()
        self.blocks, offset = {}, 0
        for b in blocks:
            self.blocks[b.name] = (b, offset)
            offset += b.local_rows

    def load(self, name: str, tensor: torch.Tensor, kind: str = "weight") -> None:
        """tensor: the checkpoint's rows of block `name` ([rows, in] weight or [rows] bias)."""
        block, offset = self.blocks[name]
        self.note_loaded(tensor, kind)
        getattr(self, kind).data[offset:offset + block.local_rows].copy_(block.rows_of(tensor, self.tp.rank))


class RowParallelLinear(QuantizableLinear):
    """x [T, local input columns] -> [T, out], summed over the ranks."""

    def __init__(self, block: Block, out_features: int, bias: bool = False, reduce: bool = True):
        """reduce=False: return this rank's partial sum (the caller sums it with others in one all-reduce;
        a bias is then added by rank 0 only)."""
        super().__init__(block.local_rows, out_features, bias=bias)
        self.tp = current_tp()
        self.block = block
        self.reduce = reduce

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return self.matmul(x, self.bias)
        y = self.matmul(x, None)
        if self.reduce:
            y = self.tp.all_reduce(y)
        return y + self.bias if self.bias is not None and (self.reduce or self.tp.rank == 0) else y

    def load(self, tensor: torch.Tensor, kind: str = "weight") -> None:
        """tensor: the checkpoint's whole weight [out, in] (columns sliced) or bias [out]."""
        part = self.block.rows_of(tensor, self.tp.rank, dim=1) if kind == "weight" else tensor
        self.note_loaded(tensor, kind)
        getattr(self, kind).data.copy_(part)


class VocabParallelEmbedding(nn.Embedding):
    """ids [T] -> [T, H]. Rank r holds rows [r * V_r, (r + 1) * V_r); ids elsewhere look up zeros, and
    one all-reduce puts each row together."""

    def __init__(self, vocab_size: int, hidden_size: int):
        self.tp = current_tp()
        self.vocab_size = vocab_size
        super().__init__(vocab_split(vocab_size, self.tp.size), hidden_size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(ids)
        start = self.tp.rank * self.num_embeddings
        local = ids - start
        outside = (local < 0) | (local >= self.num_embeddings)
        x = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(x.masked_fill(outside[:, None], 0.0))

    def load(self, tensor: torch.Tensor) -> None:
        """tensor: the checkpoint's [V, H]; the padding rows past V stay zero."""
        start = self.tp.rank * self.num_embeddings
        part = tensor[start:start + self.num_embeddings]
        self.weight.data.zero_()
        self.weight.data[:part.shape[0]].copy_(part)


class ParallelLMHead(VocabParallelEmbedding):
    """hidden [N, H] -> logits [N, V] on every rank: each rank's vocabulary rows, all-gathered."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight)
        if self.tp.size == 1:
            return logits
        return self.tp.all_gather(logits)[:, :self.vocab_size]
