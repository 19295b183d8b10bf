"""HTTP load generator for a running server, in the manner of SGLang's bench_serving (standard
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

from http_client import HTTPError, fetch, fetch_json, open_request
from serving_data import BenchRequest, random_requests, sharegpt_requests
from serving_launch import launched_server
from serving_report import render, summarize


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
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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


if __name__ == "__main__":
    sys.exit(0 if main()["metrics"]["completed"] else 1)
