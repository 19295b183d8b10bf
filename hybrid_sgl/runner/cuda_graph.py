"""CUDA graphs of whole steps, one per captured shape (tokens, rows): decode steps (input
derivation + forward + logits of every row) and extend steps (input derivation + forward to the
final hidden states; the logit rows of a step are picked after the replay).

Eager steps pay the host's launch path for every kernel (Triton's launcher, the torch ops around
it: about 1 ms a layer at real shapes) while the device idles; a replay costs one input copy and
one launch. Every kernel on these paths indexes its work on the device (varlen chunks by virtual
index, paged attention by cu_seqlens / block tables), so the whole step is captured, recurrent and
attention kernels included, and not only the pieces between them.

A plan runs in the smallest captured shape that holds it; the step-input builder (step_inputs.py)
pads the rest with pad-slot rows that touch no request's state or KV. Snapshot cuts are device inputs
of the recurrent kernels like the rest, so a step with cuts replays its shape's graph too. Steps the
graphs do not take (too large, tensor parallelism) run eagerly through the same builder.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from hybrid_sgl.batch import ForwardBatch, ForwardMode, StepPlan
from hybrid_sgl.runner.step_inputs import StepInputs

logger = logging.getLogger(__name__)


def decode_sizes(max_bs: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, 257, 16)) + list(range(288, max_bs + 1, 32))
    return sorted({s for s in sizes if s < max_bs} | {max_bs})


def extend_token_sizes(max_tokens: int) -> list[int]:
    """16, 24, 32, 48, 64, 96, ... (powers of two and 1.5x them) below max_tokens, and max_tokens."""
    sizes, s = [], 16
    while s < max_tokens:
        sizes.append(s)
        s = s * 3 // 2 if s & (s - 1) == 0 else s * 4 // 3
    return sorted(set(sizes) | {max_tokens}) if max_tokens >= 1 else []


EXTEND_ROW_SIZES = (2, 8, 32, 64)  # rows of an extend shape: one more than its requests at least (a pad row)


def extend_shapes(max_tokens: int, max_rows: int) -> list[tuple[int, int]]:
    rows = sorted({r for r in EXTEND_ROW_SIZES if r < max_rows} | {min(max_rows, EXTEND_ROW_SIZES[-1])})
    return [(t, r) for t in extend_token_sizes(max_tokens) for r in rows if r <= t + 1]


def short_row_shapes(max_bs: int, run: int) -> list[tuple[int, int]]:
    """Shapes of short-row extend steps (speculative verify steps of `run` tokens a row): (bs * run, bs + 1)
    for the decode batch sizes."""
    return [(bs * run, bs + 1) for bs in decode_sizes(max_bs)]


class StepGraphs:
    """Graphs of one step kind. DECODE shapes are (bs, bs) and return logits [B, V]; EXTEND shapes
    return hidden states [T, H]. with_prev: decode rows may take the previous step's sampled ids.
    short_rows: extend graphs whose recurrent layers step token by token; they take only plans whose
    rows hold at most SHORT_ROW_TOKENS tokens (StepPlan.short_rows)."""

    def __init__(self, *, model: torch.nn.Module, inputs: StepInputs, mode: ForwardMode,
                 shapes: list[tuple[int, int]], with_prev: bool = False, short_rows: bool = False,
                 replay_recurrent: bool = False, forward: Callable[[ForwardBatch], torch.Tensor] | None = None):
        """forward: what a graph runs on its step's ForwardBatch (default: the model, then the logits of a
        decode step); its output [T or B, ...] is read after each replay. replay_recurrent: verify graphs
        whose gated-delta-rule layers keep checkpoints (ForwardBatch.replay_recurrent); they take only such
        plans, and other graphs never take them."""
        self.model, self.inputs, self.mode, self.with_prev = model, inputs, mode, with_prev
        self.short_rows, self.replay_recurrent = short_rows, replay_recurrent
        self.forward = forward
        self.shapes = sorted(shapes)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}

    def shape_for(self, plan: StepPlan) -> tuple[int, int] | None:
        """The smallest shape that holds the plan (extend shapes keep a pad row), or None."""
        t, b = plan.num_tokens, plan.num_rows
        if (plan.mode is not self.mode or (self.short_rows and not plan.short_rows)
                or plan.replay_recurrent != self.replay_recurrent):
            return None
        pad_row = 1 if self.mode is ForwardMode.EXTEND else 0
        fits = [(T, B) for T, B in self.shapes if t <= T and b + pad_row <= B]
        return min(fits) if fits else None

    def _forward(self, shape: tuple[int, int]) -> torch.Tensor:
        fb = self.inputs.batch(self.mode, *shape, with_prev=self.with_prev, short_rows=self.short_rows,
                               replay_recurrent=self.replay_recurrent)
        if self.forward is not None:
            return self.forward(fb)
        hidden = self.model(fb)
        return self.model.compute_logits(hidden) if self.mode is ForwardMode.DECODE else hidden

    @torch.inference_mode()
    def capture(self) -> None:
        """Capture every shape (largest first, so smaller graphs reuse its memory)."""
        start = time.perf_counter()
        empty = StepPlan(mode=self.mode, tokens=[], prefix_lens=[], slots=[])
        captured = capture_each(reversed(self.shapes), lambda shape: self.inputs.fill(empty, *shape), self._forward)
        for shape, (graph, output) in captured.items():
            self.graphs[shape], self.outputs[shape] = graph, output
        logger.info("captured %s%s CUDA graphs for %d shapes (tokens, rows) %s in %.1f s", self.mode.value,
                    " (short rows)" if self.short_rows else "", len(self.shapes), _short(self.shapes),
                    time.perf_counter() - start)

    def run(self, plan: StepPlan, shape: tuple[int, int], prev_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Replay `shape`'s graph for `plan`. Returns decode logits [B, V] or extend hidden states [T, H]
        of the plan's rows (valid until the next replay)."""
        self.inputs.fill(plan, *shape, prev_ids=prev_ids)
        self.graphs[shape].replay()
        n = plan.num_rows if self.mode is ForwardMode.DECODE else plan.num_tokens
        return self.outputs[shape][:n]


def capture_each(keys: Iterable, prepare: Callable[[Any], None], forward: Callable[[Any], Any]) -> dict:
    """Capture forward(key) for each key, in the order given, into one memory pool. prepare(key) first fills
    the static inputs (pad rows only: the two warm-up runs before each capture, which compile and autotune
    outside it, touch no slot). Returns {key: (graph, forward's output, read after each replay)}.
    Python's cycle collector stays off meanwhile: collecting what an earlier engine left (its graphs, events,
    pinned buffers) frees CUDA objects, which is illegal while a stream captures and invalidates the capture
    (torch no longer collects before capturing)."""
    gc.collect()
    collecting = gc.isenabled()
    gc.disable()
    try:
        pool, stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
        captured = {}
        for key in keys:
            prepare(key)
            # the warm-ups run on `stream`, which must first wait for the caller's queued work (buffer fills, the
            # pools' initialization): a new stream does not wait for the caller's by itself
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    forward(key)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                output = forward(key)
            captured[key] = (graph, output)
        torch.cuda.synchronize()
        return captured
    finally:
        if collecting:
            gc.enable()


def _short(shapes: list[tuple[int, int]]) -> str:
    if len(shapes) <= 6:
        return str(shapes)
    return f"{shapes[:3]} ... {shapes[-2:]}"
