"""Per-step timing of a running Engine, instrumented from outside (nothing in the runtime changes).

While a StepTimer is installed, every scheduler step on the engine thread leaves a StepRecord:
- host time (time.perf_counter) of the whole step, of scheduling, of building the batch
  (StepInputs.fill, or on the CUDA-graph paths StepGraphs.run: filling the static input
  buffers and launching the replay) and of ModelRunner.run (which ends when the sampled ids reach
  the host, so it includes waiting);
- device time of the model forward: CUDA events around each CUDA-graph replay (exact device time
  of the decode graph) or, for eager forwards, around the model call (a span that also contains
  the gaps while the host launches kernels); on CPU the host time of the model call;
- what the step computed: mode, batch size, new tokens, live tokens, attention pairs, logit rows.

`host_s = wall_s - forward_s`: per step, the time the device is not running the model forward
(scheduling, batch building, launches, sampling, result bookkeeping, the engine loop).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from hybrid_sgl.batch import ForwardMode


@dataclass
class StepRecord:
    mode: str = ""
    batch: int = 0
    new_tokens: int = 0
    context_tokens: int = 0  # sum over requests of their length after the step
    attn_pairs: int = 0  # causal (query, key) pairs of the new tokens
    logit_rows: int = 0
    start: float = 0.0
    end: float = 0.0
    next_start: float | None = None  # start of the following step (the loop's own time included)
    schedule_s: float = 0.0
    build_s: float = 0.0
    run_s: float = 0.0
    forward_s: float = 0.0
    forward_kind: str = ""  # "graph" (device time), "eager" (device span), "host" (CPU device)
    events: list = field(default_factory=list, repr=False)  # (kind, start, end) until resolved

    @property
    def wall_s(self) -> float:
        return (self.next_start or self.end) - self.start

    @property
    def host_s(self) -> float:
        return self.wall_s - self.forward_s


class _TimedGraph:
    def __init__(self, graph, timer: StepTimer):
        self.graph = graph
        self.timer = timer

    def replay(self) -> None:
        mark = self.timer.mark("graph")
        self.graph.replay()
        mark()


class StepTimer:
    def __init__(self, engine):
        self.engine = engine
        self.runner = engine.runner
        self.scheduler = engine.scheduler
        self.on_cuda = self.runner.device.type == "cuda"
        self.records: list[StepRecord] = []
        self._current: StepRecord | None = None
        self._undo: list = []
        self._stop_forward = lambda: None

    # ---- install / remove ------------------------------------------------------------------------
    def __enter__(self) -> StepTimer:
        sched, runner = self.scheduler, self.runner
        self._wrap_instance(sched, "step", self._timed_step)
        self._wrap_instance(sched, "_schedule", self._timed_schedule)
        self._wrap_instance(sched, "_follow_up", self._timed_follow_up)  # overlapped decode steps
        self._wrap_instance(runner, "run", self._timed_run)
        self._wrap_instance(runner, "launch_decode", self._timed_run)
        self._wrap_instance(runner.inputs, "fill", lambda original, *a, **k: self._timed(original, "build_s", *a, **k))
        pre = runner.model.register_forward_pre_hook(lambda *_: self._start_forward())
        post = runner.model.register_forward_hook(lambda *_: self._end_forward())
        self._undo += [pre.remove, post.remove]
        for graphs in (runner.graphs, runner.extend_graphs, runner.verify_graphs):  # graph paths fill buffers, replay
            if graphs is None:
                continue
            self._wrap_instance(graphs, "run", self._timed_graph_run)
            originals = dict(graphs.graphs)
            graphs.graphs.update({shape: _TimedGraph(g, self) for shape, g in originals.items()})
            self._undo.append(lambda graphs=graphs, originals=originals: graphs.graphs.update(originals))
        return self

    def __exit__(self, *exc) -> None:
        while self._undo:
            self._undo.pop()()

    def _wrap_instance(self, obj, name: str, wrapper) -> None:
        original = getattr(obj, name)
        setattr(obj, name, lambda *a, **k: wrapper(original, *a, **k))
        self._undo.append(lambda: delattr(obj, name))

    # ---- results ---------------------------------------------------------------------------------
    def take(self) -> list[StepRecord]:
        """The records so far, with device times resolved; starts a new list."""
        if self.on_cuda:
            torch.cuda.synchronize(self.runner.device)
        records, self.records = self.records, []
        for prev, rec in zip(records, records[1:]):
            prev.next_start = rec.start
        for rec in records:
            for kind, start, end in rec.events:
                rec.forward_kind = kind
                rec.forward_s += start.elapsed_time(end) * 1e-3 if self.on_cuda else end - start
            rec.events = []
        return records

    # ---- wrappers (engine thread) ----------------------------------------------------------------
    def _timed_step(self, original):
        rec = StepRecord(start=time.perf_counter())
        self._current = rec
        try:
            return original()
        finally:
            rec.end = time.perf_counter()
            self._current = None
            if rec.mode:
                self.records.append(rec)

    def _timed_schedule(self, original):
        t = time.perf_counter()
        mode, items = original()
        self._describe(t, mode, items)
        return mode, items

    def _timed_follow_up(self, original, pending):
        """With --enable-overlap-schedule a step launches the next decode batch (from here) and then
        reads the previous one: the record describes the launched batch."""
        t = time.perf_counter()
        follow = original(pending)
        if follow is not None:
            self._describe(t, ForwardMode.DECODE, follow[0])
        return follow

    def _describe(self, t: float, mode, items) -> None:
        rec = self._current
        if rec is not None and items:
            rec.schedule_s = time.perf_counter() - t
            rec.mode = "decode" if mode is ForwardMode.DECODE else "extend"
            rec.batch = len(items)
            for it in items:
                n = it.end - it.start
                rec.new_tokens += n
                rec.context_tokens += it.end
                rec.attn_pairs += n * it.start + n * (n + 1) // 2
                rec.logit_rows += it.sample

    def _timed_graph_run(self, original, *args, **kwargs):
        return self._timed(original, "build_s", *args, **kwargs)

    def _timed_run(self, original, *args, **kwargs):
        return self._timed(original, "run_s", *args, **kwargs)

    def _timed(self, fn, field: str, *args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            rec = self._current
            if rec is not None:
                setattr(rec, field, getattr(rec, field) + time.perf_counter() - t)

    def mark(self, kind: str):
        """Start a device-time interval now; returns the function that ends it."""
        rec = self._current
        if rec is None:
            return lambda: None
        if not self.on_cuda:
            start = time.perf_counter()
            return lambda: rec.events.append(("host", start, time.perf_counter()))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()

        def stop():
            end.record()
            rec.events.append((kind, start, end))

        return stop

    def _start_forward(self) -> None:
        self._stop_forward = self.mark("eager")

    def _end_forward(self) -> None:
        self._stop_forward()
