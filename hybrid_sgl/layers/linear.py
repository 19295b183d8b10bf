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

Column and row linears run the matmuls of the DenseOps they are built with (layers/backends.py); on
CUDA a 16-bit linear at decode sizes runs cuBLAS or our few-rows kernel, whichever timed faster for
its shape (triton_kernels/dense_linear.py). They may hold FP8 weights (layers/quantization.py:
QuantizableLinear): `to_fp8()` after loading makes the weight e4m3 [out, in] with `weight_scale_inv`
[ceil(out/128), ceil(in/128)], and the layer's matmul becomes the block-scaled FP8 GEMM. The
families never see the difference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from hybrid_sgl.distributed import current_tp
from hybrid_sgl.distributed.sharding import HeadSplit, replicated, vocab_split
from hybrid_sgl.layers.backends import DenseOps
from hybrid_sgl.layers.quantization import QuantizableLinear

# the 16-bit matmul a CUDA linear layer runs, under the name tests/gpu/test_dense_linear_cuda.py imports
from triton_kernels.dense_linear import dense_linear, dense_linear_choice  # noqa: F401


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


class ColumnParallelLinear(QuantizableLinear):
    """x [T, in] -> [T, sum of the blocks' local rows]."""

    def __init__(self, in_features: int, blocks: list[Block], bias: bool = False, *, ops: DenseOps):
        super().__init__(in_features, sum(b.local_rows for b in blocks), bias, ops)
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

    def __init__(self, block: Block, out_features: int, bias: bool = False, reduce: bool = True, *, ops: DenseOps):
        """reduce=False: return this rank's partial sum (the caller sums it with others in one all-reduce;
        a bias is then added by rank 0 only)."""
        super().__init__(block.local_rows, out_features, bias, ops)
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
