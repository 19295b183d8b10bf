"""Serving metrics in Prometheus' text format (GET /metrics), under SGLang's metric names.

Counters and histograms are updated on the HTTP event loop as outputs arrive; gauges
(running / waiting requests, pool usage) are read on the engine thread at scrape time.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from hybrid_sgl.outputs import OutputState

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
THROUGHPUT_WINDOW_S = 10.0


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self):
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        self.total += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f'{name}_bucket{{{labels},le="{b:g}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        out += [f'{name}_bucket{{{labels},le="+Inf"}} {self.count}',
                f"{name}_sum{{{labels}}} {self.total:.6f}", f"{name}_count{{{labels}}} {self.count}"]
        return out


def engine_stats(scheduler) -> dict:
    """Run on the engine thread (engine.loop.call): the scheduler's and the pools' current state."""
    a = scheduler.allocator
    return {"num_running_reqs": len(scheduler.running), "num_waiting_reqs": len(scheduler.waiting),
            "num_free_slots": a.num_free_slots, "num_slots": a.num_slots,
            "num_free_pages": a.num_free_pages, "num_pages": a.num_pages, "page_size": a.page_size,
            "num_preemptions": scheduler.num_preemptions}


class Metrics:
    def __init__(self, model_name: str):
        self.labels = f'model_name="{_escape(model_name)}"'
        self.start_time = time.time()
        self.num_requests = 0
        self.num_aborted = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self._recent: deque[tuple[float, int]] = deque()  # (time, new tokens)

    def tracker(self, count: int) -> RequestTracker:
        return RequestTracker(self, count)

    def add_tokens(self, n: int) -> None:
        now = time.monotonic()
        self.generation_tokens += n
        self._recent.append((now, n))
        self._trim(now)

    def throughput(self) -> float:
        """Generated tokens per second over the last THROUGHPUT_WINDOW_S seconds."""
        now = time.monotonic()
        self._trim(now)
        return sum(n for _, n in self._recent) / THROUGHPUT_WINDOW_S

    def _trim(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - THROUGHPUT_WINDOW_S:
            self._recent.popleft()

    def render(self, stats: dict) -> str:
        used_pages = stats["num_pages"] - stats["num_free_pages"]
        gauges = [
            ("num_running_reqs", "Requests running (holding a state slot).", stats["num_running_reqs"]),
            ("num_queue_reqs", "Requests waiting to be scheduled.", stats["num_waiting_reqs"]),
            ("num_used_tokens", "KV-cache tokens in use (pages x page size).", used_pages * stats["page_size"]),
            ("token_usage", "Share of KV-cache pages in use.", used_pages / max(stats["num_pages"], 1)),
            ("state_slot_usage", "Share of recurrent-state slots in use.",
             1 - stats["num_free_slots"] / max(stats["num_slots"], 1)),
            ("gen_throughput", f"Generated tokens per second over the last {THROUGHPUT_WINDOW_S:g} s.",
             self.throughput()),
        ]
        counters = [
            ("num_requests_total", "Requests finished (incl. aborted).", self.num_requests),
            ("num_aborted_requests_total", "Requests aborted (client gone or error).", self.num_aborted),
            ("prompt_tokens_total", "Prompt tokens of finished requests.", self.prompt_tokens),
            ("generation_tokens_total", "Generated tokens.", self.generation_tokens),
            ("num_preemptions_total", "Requests preempted to free KV pages.", stats["num_preemptions"]),
        ]
        lines = []
        for name, help_text, value in gauges:
            lines += _header(name, help_text, "gauge") + [f"sglang:{name}{{{self.labels}}} {_num(value)}"]
        for name, help_text, value in counters:
            lines += _header(name, help_text, "counter") + [f"sglang:{name}{{{self.labels}}} {_num(value)}"]
        lines += _header("time_to_first_token_seconds", "Time to first token.", "histogram")
        lines += self.ttft.lines("sglang:time_to_first_token_seconds", self.labels)
        lines += _header("e2e_request_latency_seconds", "End-to-end request latency.", "histogram")
        lines += self.e2e.lines("sglang:e2e_request_latency_seconds", self.labels)
        return "\n".join(lines) + "\n"


class RequestTracker:
    """Follows the outputs of one HTTP request and reports each event once."""

    def __init__(self, metrics: Metrics, count: int):
        self.metrics = metrics
        self.seen_tokens = [0] * count
        self.first_seen = [False] * count
        self.done = [False] * count

    def update(self, index: int, out: OutputState) -> None:
        m = self.metrics
        new = out.completion_tokens - self.seen_tokens[index]
        if new > 0:
            m.add_tokens(new)
            self.seen_tokens[index] = out.completion_tokens
        if not self.first_seen[index] and out.first_token_time is not None:
            self.first_seen[index] = True
            m.ttft.observe(out.first_token_time - out.start)
        if out.finished and not self.done[index]:
            self.done[index] = True
            m.num_requests += 1
            m.num_aborted += out.finish_reason.get("type") == "abort"
            m.prompt_tokens += out.prompt_tokens
            m.e2e.observe(time.monotonic() - out.start)

    def close(self) -> None:
        """The HTTP request ended: what did not finish was aborted (client gone)."""
        for i, done in enumerate(self.done):
            if not done:
                self.done[i] = True
                self.metrics.num_requests += 1
                self.metrics.num_aborted += 1


def _header(name: str, help_text: str, kind: str) -> list[str]:
    return [f"# HELP sglang:{name} {help_text}", f"# TYPE sglang:{name} {kind}"]


def _num(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
