"""Question: what TTFT, TPOT and throughput does the HTTP server give under load, and does it stay inside its
memory plan?

HTTP load generator for a running server, in the manner of SGLang's bench_serving (standard
library only).

    python bench/serving.py --base-url http://127.0.0.1:30000 --num-prompts 256 \
        --random-input-len 1024 --random-output-len 256 --request-rate inf --out serving.json
    python bench/serving.py --launch "--model-path configs/qwen3_5-9b-text --load-format dummy \
        --skip-tokenizer-init" --num-prompts 256 ...      # starts the server, benchmarks, stops it

Streams every request (native /generate, or /v1/completions with --backend openai) with
ignore_eos, so outputs reach their length. Per request: TTFT (send to first token), TPOT
((latency - TTFT) / (tokens - 1)), ITL (time between streamed chunks that carry new tokens; a chunk
with several tokens counts once), end-to-end latency. The server's memory plan comes from
/get_server_info before and after; running requests and pool usage are sampled from /metrics
during the run (peaks reported), so they can be held against the plan.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field

from http_client import HTTPError, fetch, fetch_json, launched_server, open_request

# ---- requests ----------------------------------------------------------------------------------
# Requests for the load generator: random token ids of chosen lengths, or a ShareGPT-style file.
#
# Prompts are always sent as token ids, so a server without a tokenizer (random weights,
# --skip-tokenizer-init) serves them too.
CHARS_PER_TOKEN = 4  # length estimate when the server has no tokenizer


@dataclass(frozen=True)
class BenchRequest:
    prompt_ids: list[int]
    output_len: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


def random_requests(num: int, input_len: int, output_len: int, range_ratio: float, vocab_size: int,
                    seed: int) -> list[BenchRequest]:
    """Lengths uniform in [max(1, len * range_ratio), len] (range_ratio 1: all exactly len); ids
    uniform over the vocabulary."""
    rng = random.Random(seed)

    def length(full: int) -> int:
        return rng.randint(max(1, int(full * range_ratio)), full)

    return [BenchRequest([rng.randrange(vocab_size) for _ in range(length(input_len))], length(output_len))
            for _ in range(num)]


async def sharegpt_requests(path: str, num: int, tokenize, vocab_size: int, context_length: int, seed: int,
                            output_len: int | None = None) -> tuple[list[BenchRequest], str]:
    """The first human turn of each conversation as the prompt, the reply's length as the output
    length (or `output_len`). tokenize: async (list[str]) -> list[list[int]], or None when the
    server has no tokenizer: then lengths are characters / CHARS_PER_TOKEN and the ids random.
    Conversations shorter than 4 tokens either way or longer than the context are left out, as
    SGLang's bench_serving does. Returns (requests, how lengths were counted)."""
    with open(path) as f:
        data = json.load(f)
    pairs = []
    for item in data:
        turns = item.get("conversations") or item.get("conversation") or []
        if len(turns) >= 2:
            pairs.append((_text(turns[0]), _text(turns[1])))
    random.Random(seed).shuffle(pairs)
    rng = random.Random(seed + 1)
    counted = "server tokenizer" if tokenize else f"characters / {CHARS_PER_TOKEN} (server has no tokenizer)"
    requests: list[BenchRequest] = []
    for start in range(0, len(pairs), 256):
        chunk = pairs[start:start + 256]
        if tokenize:
            prompts = await tokenize([p for p, _ in chunk])
            replies = [len(ids) for ids in await tokenize([r for _, r in chunk])]
        else:
            prompts = [[rng.randrange(vocab_size) for _ in range(len(p) // CHARS_PER_TOKEN)] for p, _ in chunk]
            replies = [len(r) // CHARS_PER_TOKEN for _, r in chunk]
        for ids, reply in zip(prompts, replies):
            out = output_len or reply
            if len(ids) < 4 or out < 4 or len(ids) + out > context_length:
                continue
            requests.append(BenchRequest(ids, out))
            if len(requests) == num:
                return requests, counted
    return requests, counted


def _text(turn) -> str:
    if isinstance(turn, dict):
        return turn.get("value") or turn.get("content") or ""
    return str(turn)


@dataclass
class RequestResult:
    prompt_len: int
    output_len: int  # asked for
    generated: int = 0
    ttft: float | None = None
    latency: float = 0.0
    itls: list[float] = field(default_factory=list)
    error: str | None = None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:30000")
    p.add_argument("--backend", default="native", choices=["native", "openai"],
                   help="native: POST /generate; openai: POST /v1/completions (needs a server tokenizer)")
    p.add_argument("--dataset", default="random", choices=["random", "sharegpt"])
    p.add_argument("--dataset-path", default=None, help="ShareGPT-style JSON file (--dataset sharegpt)")
    p.add_argument("--sharegpt-output-len", type=int, default=None, help="override the replies' lengths")
    p.add_argument("--num-prompts", type=int, default=256)
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=256)
    p.add_argument("--random-range-ratio", type=float, default=1.0,
                   help="lengths uniform in [len * ratio, len]; 1.0: all exactly len")
    p.add_argument("--vocab-size", type=int, default=None, help="default: from the served model's config.json")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second (Poisson arrivals); inf sends all at once")
    p.add_argument("--max-concurrency", type=int, default=None, help="most requests in flight at once")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--warmup-requests", type=int, default=1, help="sent together before the run, not measured")
    p.add_argument("--poll-interval", type=float, default=0.2, help="seconds between /metrics samples")
    p.add_argument("--request-timeout", type=float, default=3600.0)
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--launch", default=None, metavar="SERVER_ARGS",
                   help="start python -m hybrid_sgl.launch_server with these arguments, benchmark it, stop it")
    p.add_argument("--launch-timeout", type=float, default=1200.0, help="seconds to wait for /health")
    p.add_argument("--launch-log", default="server.log")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


# ---- one request ---------------------------------------------------------------------------------
def _payload(backend: str, req: BenchRequest, temperature: float, model: str) -> tuple[str, dict]:
    if backend == "native":
        return "/generate", {"input_ids": req.prompt_ids, "stream": True, "sampling_params": {
            "max_new_tokens": req.output_len, "ignore_eos": True, "temperature": temperature}}
    return "/v1/completions", {"model": model, "prompt": req.prompt_ids, "max_tokens": req.output_len,
                               "temperature": temperature, "ignore_eos": True, "stream": True,
                               "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


def _tokens_so_far(backend: str, event: dict, previous: int) -> int:
    if backend == "native":
        return event["meta_info"]["completion_tokens"]
    if event.get("usage"):
        return event["usage"]["completion_tokens"]
    choices = event.get("choices") or []
    return previous + (1 if choices and choices[0].get("text") else 0)


async def send(args, req: BenchRequest, model: str) -> RequestResult:
    path, payload = _payload(args.backend, req, args.temperature, model)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    result = RequestResult(prompt_len=req.prompt_len, output_len=req.output_len)
    start = last = time.perf_counter()
    try:
        response = await open_request(args.base_url + path, "POST", payload, headers, args.request_timeout)
        try:
            if response.status != 200:
                raise HTTPError(response.status, await response.body())
            async for arrived, data in response.events():
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    raise RuntimeError(event["error"].get("message", str(event["error"])))
                tokens = _tokens_so_far(args.backend, event, result.generated)
                if tokens > result.generated:
                    if result.ttft is None:
                        result.ttft = arrived - start
                    else:
                        result.itls.append(arrived - last)
                    last, result.generated = arrived, tokens
        finally:
            response.close()
    except Exception as e:  # reported per request; the run goes on
        result.error = f"{type(e).__name__}: {e}"
    result.latency = time.perf_counter() - start
    if result.error is None and result.generated < req.output_len:
        result.error = f"stopped after {result.generated} of {req.output_len} tokens"
    return result


# ---- the run -------------------------------------------------------------------------------------
async def poll_metrics(base_url: str, interval: float, peaks: dict, stop: asyncio.Event) -> None:
    names = ("num_running_reqs", "num_queue_reqs", "num_used_tokens", "token_usage", "state_slot_usage")
    while not stop.is_set():
        try:
            text = (await fetch(base_url + "/metrics", timeout=10)).decode()
            for line in text.splitlines():
                name = line.split("{", 1)[0].removeprefix("sglang:")
                if name in names:
                    peaks[name] = max(peaks.get(name, 0), float(line.rsplit(" ", 1)[1]))
            peaks["samples"] = peaks.get("samples", 0) + 1
        except Exception as e:  # a missed sample is not a failed run
            peaks["sample_errors"] = f"{type(e).__name__}: {e}"
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)


async def run_load(args, requests: list[BenchRequest], model: str) -> tuple[list[RequestResult], float, dict]:
    rng = random.Random(args.seed)
    limit = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None

    async def limited(req: BenchRequest) -> RequestResult:
        if limit is None:
            return await send(args, req, model)
        async with limit:
            return await send(args, req, model)

    peaks, stop = {}, asyncio.Event()
    poller = asyncio.create_task(poll_metrics(args.base_url, args.poll_interval, peaks, stop))
    start = time.perf_counter()
    tasks = []
    for i, req in enumerate(requests):
        if i and args.request_rate != float("inf"):
            await asyncio.sleep(rng.expovariate(args.request_rate))
        tasks.append(asyncio.create_task(limited(req)))
    results = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    stop.set()
    await poller
    return results, duration, peaks


def _vocab_size(args, info: dict) -> int:
    if args.vocab_size:
        return args.vocab_size
    path = os.path.join(info.get("model_path") or "", "config.json")
    try:
        with open(path) as f:
            hf = json.load(f)
    except OSError as e:
        raise SystemExit(f"cannot read {path} to learn the vocabulary size ({e}); pass --vocab-size") from e
    return (hf.get("text_config") or hf)["vocab_size"]


async def benchmark(args) -> dict:
    info_before = await fetch_json(args.base_url + "/get_server_info")
    model = info_before.get("served_model_name") or "default"
    context = info_before.get("context_length") or 1 << 30
    vocab = _vocab_size(args, info_before)
    if args.dataset == "random":
        requests = random_requests(args.num_prompts, args.random_input_len, args.random_output_len,
                                   args.random_range_ratio, vocab, args.seed)
        counted = "exact (token ids)"
    else:
        if not args.dataset_path:
            raise SystemExit("--dataset sharegpt needs --dataset-path FILE")
        tokenize = None if info_before.get("skip_tokenizer_init") else (lambda texts: _tokenize(args, texts))
        requests, counted = await sharegpt_requests(args.dataset_path, args.num_prompts, tokenize, vocab, context,
                                                    args.seed, args.sharegpt_output_len)
        if not requests:
            raise SystemExit(f"no usable conversation in {args.dataset_path}")
    # Warm-up, not measured: the first requests at full length, sent together (compiles the kernel
    # variants a burst of prefill chunks needs)
    warm = [BenchRequest(requests[i % len(requests)].prompt_ids, min(4, requests[i % len(requests)].output_len))
            for i in range(args.warmup_requests)]
    failed = [r.error for r in await asyncio.gather(*(send(args, w, model) for w in warm)) if r.error]
    if failed:
        raise SystemExit(f"{len(failed)} warm-up requests failed, e.g. {failed[0]}")
    results, duration, peaks = await run_load(args, requests, model)
    info_after = await fetch_json(args.base_url + "/get_server_info")
    return {"args": vars(args), "lengths_counted": counted, "duration_s": duration,
            "metrics": summarize(results, duration), "server": _server_report(info_before, info_after, peaks),
            "requests": [{k: v for k, v in asdict(r).items() if k != "itls"} for r in results]}


async def _tokenize(args, texts: list[str]) -> list[list[int]]:
    body = {"prompt": texts, "add_special_tokens": False}
    return (await fetch_json(args.base_url + "/tokenize", method="POST", payload=body))["tokens"]


def _server_report(before: dict, after: dict, peaks: dict) -> dict:
    keep = ("model_path", "served_model_name", "max_running_requests", "max_total_num_tokens", "context_length",
            "state_bytes_per_request", "kv_bytes_per_token", "chunked_prefill_size", "page_size", "version")
    state_before = (before.get("internal_states") or [{}])[0]
    state_after = (after.get("internal_states") or [{}])[0]
    report = {k: before.get(k) for k in keep}
    report.update({"peaks": peaks, "state_before": state_before, "state_after": state_after,
                   "preemptions": state_after.get("num_preemptions", 0) - state_before.get("num_preemptions", 0)})
    return report


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.launch is not None:
        with launched_server(args.launch, args.launch_log, args.launch_timeout) as url:
            args.base_url = url
            result = asyncio.run(benchmark(args))
    else:
        result = asyncio.run(benchmark(args))
    print(render(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


# ---- metrics (SGLang bench_serving's names) and the text report ------------------------------
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


if __name__ == "__main__":
    sys.exit(0 if main()["metrics"]["completed"] else 1)
