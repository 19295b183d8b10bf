"""Serving metrics for GET /metrics on prometheus-client, under SGLang's metric names (`sglang:`).

Counters and histograms are updated on the HTTP event loop as outputs arrive (RequestTracker);
gauges (running / waiting requests, pool usage, retractions) come from the engine's stats() at
scrape time. Each app has its own registry, labelled with the served model name.
"""

from __future__ import annotations

import os
import time
from collections import deque

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from hybrid_sgl.outputs import OutputState

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
QUEUE_BUCKETS = (0.0, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0)
THROUGHPUT_WINDOW_S = 10.0
disable_created_metrics()  # no *_created series: SGLang's exposition has none either


def public_model_name(served_model_name: str, model_path: str) -> str:
    """The name the metrics carry: the served name, or the model folder's name (never the full
    filesystem path) when the served name defaulted to the path."""
    if served_model_name == model_path:
        return os.path.basename(os.path.normpath(model_path)) or served_model_name
    return served_model_name


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, model_name: str, max_total_num_tokens: int = 0, context_len: int = 0):
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        self.start_time = time.time()
        self._recent: deque[tuple[float, int]] = deque()  # (time, new tokens)
        self._retracted_seen = 0
        self._prompt_tokens = self._cached_tokens = 0

        def g(name: str, doc: str):
            return Gauge(f"sglang:{name}", doc, ["model_name"], registry=self.registry).labels(model_name)

        def c(name: str, doc: str):
            return Counter(f"sglang:{name}", doc, ["model_name"], registry=self.registry).labels(model_name)

        def h(name: str, doc: str, buckets: tuple[float, ...]):
            return Histogram(f"sglang:{name}", doc, ["model_name"], registry=self.registry,
                             buckets=buckets).labels(model_name)

        self.num_running_reqs = g("num_running_reqs", "Requests running (holding a state slot).")
        self.num_queue_reqs = g("num_queue_reqs", "Requests waiting to be scheduled.")
        self.num_used_tokens = g("num_used_tokens", "KV-cache tokens in use (pages x page size).")
        self.token_usage = g("token_usage", "Share of KV-cache pages in use.")
        self.mamba_usage = g("mamba_usage", "Share of recurrent-state (Mamba / GDN) slots in use.")
        self.gen_throughput = g("gen_throughput", f"Generated tokens per second over the last "
                                                  f"{THROUGHPUT_WINDOW_S:g} s.")
        self.cache_hit_rate = g("cache_hit_rate", "Prompt tokens served from the prefix cache over all prompt "
                                                  "tokens of finished requests.")
        self.num_retracted_reqs = g("num_retracted_reqs", "Requests retracted (preempted to free KV pages) so far.")
        self.max_total_num_tokens = g("max_total_num_tokens", "KV-cache capacity in tokens.")
        self.snapshot_slots = g("prefix_cache_snapshot_slots", "Recurrent-state snapshot slots of the prefix cache.")
        self.snapshots_used = g("prefix_cache_snapshots", "Snapshots the prefix cache holds.")
        self.spec_accept_length = g("spec_accept_length", "Mean tokens a verify step gains per request with drafts "
                                                          "(speculative decoding; 0 when off).")
        self.snapshot_bytes = g("prefix_cache_snapshot_bytes", "Bytes of recurrent state the held snapshots take.")
        self.snapshots_taken = c("prefix_cache_snapshots_taken", "Snapshots the prefix cache has taken.")
        self.snapshots_hit = c("prefix_cache_snapshots_hit", "Snapshots restored into a new request.")
        self._snapshot_counts_seen = {"snapshots_taken": 0, "snapshots_hit": 0}
        self.cached_pages = g("prefix_cache_pages", "KV pages the prefix cache holds.")
        self.evictable_pages = g("prefix_cache_evictable_pages", "KV pages only the prefix cache holds, free to evict.")
        self.computed_prompt_tokens = c("computed_prompt_tokens", "Prompt tokens actually computed (prefill and "
                                                                  "recompute), after the prefix cache.")
        self._computed_seen = 0
        self.context_len = g("context_len", "Context length (prompt + output tokens) of the served model.")
        self.max_total_num_tokens.set(max_total_num_tokens)
        self.context_len.set(context_len)
        self.num_requests = c("num_requests", "Requests finished (incl. aborted).")
        self.num_aborted = c("num_aborted_requests", "Requests aborted (client gone or error).")
        self.prompt_tokens = c("prompt_tokens", "Prompt tokens of finished requests.")
        self.generation_tokens = c("generation_tokens", "Generated tokens.")
        self.cached_tokens = c("cached_tokens", "Prompt tokens served from the prefix cache.")
        self.num_retracted = c("num_retracted_requests", "Requests retracted (preempted to free KV pages).")
        self.ttft = h("time_to_first_token_seconds", "Time to first token in seconds.", buckets=TTFT_BUCKETS)
        self.itl = h("inter_token_latency_seconds", "Time between generated tokens in seconds.", buckets=ITL_BUCKETS)
        self.e2e = h("e2e_request_latency_seconds", "End-to-end request latency in seconds.", buckets=E2E_BUCKETS)
        self.queue_time = h("queue_time_seconds", "Time from arrival to first being scheduled, in seconds.",
                            buckets=QUEUE_BUCKETS)

    def tracker(self, count: int) -> RequestTracker:
        return RequestTracker(self, count)

    def add_tokens(self, n: int) -> None:
        now = time.monotonic()
        self.generation_tokens.inc(n)
        self._recent.append((now, n))
        self._trim(now)

    def add_finished(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_tokens.inc(cached_tokens)
        self._prompt_tokens += prompt_tokens
        self._cached_tokens += cached_tokens

    def throughput(self) -> float:
        """Generated tokens per second over the last THROUGHPUT_WINDOW_S seconds."""
        now = time.monotonic()
        self._trim(now)
        return sum(n for _, n in self._recent) / THROUGHPUT_WINDOW_S

    def _trim(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - THROUGHPUT_WINDOW_S:
            self._recent.popleft()

    def render(self, stats: dict) -> bytes:
        """The exposition text, gauges set from `stats` (Engine.stats())."""
        used_pages = stats["num_pages"] - stats["num_free_pages"]
        self.num_running_reqs.set(stats["num_running_reqs"])
        self.num_queue_reqs.set(stats["num_waiting_reqs"])
        self.num_used_tokens.set(used_pages * stats["page_size"])
        self.token_usage.set(used_pages / max(stats["num_pages"], 1))
        self.mamba_usage.set(1 - stats["num_free_slots"] / max(stats["num_slots"], 1))
        self.gen_throughput.set(self.throughput())
        self.cache_hit_rate.set(self._cached_tokens / max(self._prompt_tokens, 1))
        self.snapshot_slots.set(stats["snapshot_slots"])
        self.snapshots_used.set(stats["num_snapshots"])
        self.snapshot_bytes.set(stats["snapshot_bytes"])
        self.spec_accept_length.set(stats["avg_spec_accept_length"])
        for key, counter in (("snapshots_taken", self.snapshots_taken), ("snapshots_hit", self.snapshots_hit)):
            counter.inc(max(stats[key] - self._snapshot_counts_seen[key], 0))
            self._snapshot_counts_seen[key] = max(stats[key], self._snapshot_counts_seen[key])
        self.cached_pages.set(stats["cached_pages"])
        self.evictable_pages.set(stats["evictable_pages"])
        self.computed_prompt_tokens.inc(max(stats["computed_prompt_tokens"] - self._computed_seen, 0))
        self._computed_seen = max(stats["computed_prompt_tokens"], self._computed_seen)
        self.num_retracted_reqs.set(stats["num_preemptions"])
        self.num_retracted.inc(max(stats["num_preemptions"] - self._retracted_seen, 0))
        self._retracted_seen = max(stats["num_preemptions"], self._retracted_seen)
        return generate_latest(self.registry)


class RequestTracker:
    """Follows the outputs of one HTTP request and reports each event once."""

    def __init__(self, metrics: Metrics, count: int):
        self.metrics = metrics
        self.seen_tokens = [0] * count
        self.last_token_time: list[float | None] = [None] * count
        self.queued = [False] * count
        self.done = [False] * count

    def update(self, index: int, out: OutputState) -> None:
        m, now = self.metrics, time.monotonic()
        if not self.queued[index] and out.queue_time is not None:
            self.queued[index] = True
            m.queue_time.observe(out.queue_time)
        new = out.completion_tokens - self.seen_tokens[index]
        if new > 0:
            m.add_tokens(new)
            self.seen_tokens[index] = out.completion_tokens
            last = self.last_token_time[index]
            if last is None:
                if out.first_token_time is not None:
                    m.ttft.observe(out.first_token_time - out.start)
            else:
                m.itl.observe((now - last) / new)
            self.last_token_time[index] = now
        if out.finished and not self.done[index]:
            self.done[index] = True
            m.num_requests.inc()
            if out.finish_reason.get("type") == "abort":
                m.num_aborted.inc()
            m.add_finished(out.prompt_tokens, out.cached_tokens)
            m.e2e.observe(now - out.start)

    def close(self) -> None:
        """The HTTP request ended: what did not finish was aborted (client gone)."""
        for i, done in enumerate(self.done):
            if not done:
                self.done[i] = True
                self.metrics.num_requests.inc()
                self.metrics.num_aborted.inc()
