"""A choice between equivalent implementations of one operation, made once per shape by timing them on
the device (the first use comes in the decode graphs' warm-up runs, before their capture)."""

from collections.abc import Callable

import torch
import triton.testing

_CHOSEN: dict[tuple, str] = {}


def graph_time(fn: Callable[[], object], **quantiles):
    """ms per call of fn, timed as CUDA-graph replays of many calls: at decode sizes a plain launch loop
    measures the host. `fastest` and the decode kernels' autotuners time this way (the autotuners, as
    their do_bench, pass `quantiles=` and get those of the time). do_bench_cudagraph runs fn on a stream
    of its own, which does not wait for the caller's: the device is synchronized first, so that fn never
    reads inputs (say, the router's expert ids) that kernels still queued on the caller's stream write."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return triton.testing.do_bench_cudagraph(fn, rep=20, **quantiles)


def fastest(key: tuple, make_candidates: Callable[[], dict[str, Callable[[], object]]],
            margin: float = 1.0) -> str | None:
    """The name of the fastest of the candidates (name -> a call), remembered under `key`;
    make_candidates builds them only when `key` is new, so a known key costs one lookup. Each is called
    once first (which tunes its launch config), then timed as CUDA-graph replays of many calls. The
    first candidate is the incumbent: another wins only in under `margin` times its time. None for a new
    key while the current stream captures a graph: nothing can be timed inside a capture."""
    if key not in _CHOSEN:
        if torch.cuda.is_current_stream_capturing():
            return None
        candidates = make_candidates()
        times = {}
        for name, run in candidates.items():
            run()
            times[name] = graph_time(run)
        incumbent, *others = candidates
        best = min(others, key=times.get, default=incumbent)
        _CHOSEN[key] = best if others and times[best] < margin * times[incumbent] else incumbent
    return _CHOSEN[key]


def chosen(key: tuple) -> str | None:
    """What `fastest` chose under key, or None before it timed it."""
    return _CHOSEN.get(key)


def choices() -> dict[tuple, str]:
    """Every choice made so far, key -> name (the benchmarks report them)."""
    return dict(_CHOSEN)
