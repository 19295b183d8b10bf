"""Metrics of a bench/serving.py run (SGLang bench_serving's names) and its text report."""

from __future__ import annotations


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return float("nan")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _stats(seconds: list[float]) -> dict:
    ms = [1e3 * v for v in seconds]
    return {"mean": sum(ms) / len(ms) if ms else float("nan"), "p50": percentile(ms, 50),
            "p90": percentile(ms, 90), "p95": percentile(ms, 95), "p99": percentile(ms, 99), "count": len(ms)}


def summarize(results, duration: float) -> dict:
    ok = [r for r in results if r.error is None]
    errors = sorted({r.error for r in results if r.error})
    inputs, outputs = sum(r.prompt_len for r in ok), sum(r.generated for r in ok)
    return {
        "completed": len(ok), "failed": len(results) - len(ok), "errors": errors[:5],
        "duration_s": duration, "total_input_tokens": inputs, "total_output_tokens": outputs,
        "request_throughput": len(ok) / duration, "input_throughput": inputs / duration,
        "output_throughput": outputs / duration, "total_throughput": (inputs + outputs) / duration,
        "concurrency": sum(r.latency for r in ok) / duration,
        "ttft_ms": _stats([r.ttft for r in ok]),
        "tpot_ms": _stats([(r.latency - r.ttft) / (r.generated - 1) for r in ok if r.generated > 1]),
        "itl_ms": _stats([t for r in ok for t in r.itls]),
        "e2e_latency_ms": _stats([r.latency for r in ok]),
        "tokens_per_chunk": outputs / max(1, sum(len(r.itls) + 1 for r in ok)),
    }


def render(result: dict) -> str:
    m, s, a = result["metrics"], result["server"], result["args"]
    peaks, after = s["peaks"], s["state_after"]

    def row(name, value, fmt="{:.2f}"):
        return f"{name:<44}{fmt.format(value) if isinstance(value, float) else value}"

    lines = ["=" * 16 + " Serving Benchmark Result " + "=" * 16,
             row("Backend:", a["backend"]), row("Base URL:", a["base_url"]),
             row("Dataset:", f"{a['dataset']} (lengths: {result['lengths_counted']})"),
             row("Request rate (req/s):", a["request_rate"]), row("Max concurrency:", a["max_concurrency"]),
             row("Successful requests:", m["completed"]), row("Failed requests:", m["failed"]),
             row("Benchmark duration (s):", m["duration_s"]),
             row("Total input tokens:", m["total_input_tokens"]),
             row("Total generated tokens:", m["total_output_tokens"]),
             row("Request throughput (req/s):", m["request_throughput"]),
             row("Input token throughput (tok/s):", m["input_throughput"]),
             row("Output token throughput (tok/s):", m["output_throughput"]),
             row("Total token throughput (tok/s):", m["total_throughput"]),
             row("Concurrency:", m["concurrency"]), row("Tokens per streamed chunk:", m["tokens_per_chunk"])]
    for key, title in (("ttft_ms", "Time to First Token"), ("tpot_ms", "Time per Output Token (excl. 1st)"),
                       ("itl_ms", "Inter-token Latency"), ("e2e_latency_ms", "End-to-End Latency")):
        lines.append(f"{('-' * 10 + ' ' + title + ' '):-<58}")
        lines += [row(f"{stat.capitalize()} {key.split('_')[0].upper()} (ms):", m[key][stat])
                  for stat in ("mean", "p50", "p90", "p99")]
    lines.append(f"{'-' * 10 + ' Server (memory plan vs observed) ':-<58}")
    lines += [row("Max running requests (plan):", s["max_running_requests"]),
              row("Peak running requests (sampled):", peaks.get("num_running_reqs", "n/a"), "{:.0f}"),
              row("Peak queued requests (sampled):", peaks.get("num_queue_reqs", "n/a"), "{:.0f}"),
              row("Max total tokens (plan):", s["max_total_num_tokens"]),
              row("Peak KV tokens in use (sampled):", peaks.get("num_used_tokens", "n/a"), "{:.0f}"),
              row("Peak state slot usage (sampled):", peaks.get("state_slot_usage", "n/a")),
              row("Preemptions during the run:", s["preemptions"]),
              row("Pools free after the run:", _pools_free(after)),
              row("/metrics samples:", peaks.get("samples", 0))]
    if m["errors"]:
        lines += ["Errors (first distinct):", *[f"  {e}" for e in m["errors"]]]
    return "\n".join(lines + ["=" * 58])


def _pools_free(state: dict) -> str:
    if not state:
        return "n/a"
    cached = state.get("evictable_pages", 0)  # held only by the prefix cache, free to evict
    free = (state.get("num_running_reqs") == 0 and state.get("num_free_slots") == state.get("num_slots")
            and state.get("num_free_pages", 0) + cached == state.get("num_pages"))
    if not free:
        return f"no: {state}"
    return f"yes ({cached} pages kept by the prefix cache)" if cached else "yes"
