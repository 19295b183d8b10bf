"""Concurrency: 32 simultaneous requests of every kind, and the engine loop apart from the HTTP event
loop: one request's long chunked prefill delays another's streaming by about one chunk, not by
the whole prompt.

Also a benchmark: `python tests/server/test_server_concurrency.py` starts a server on the bundled
model and prints the measurements.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import httpx

LONG_PROMPT_TOKENS = 1000  # 16 chunks of 64 on the test server
CHUNK = 64


# ---- 32 concurrent requests ----------------------------------------------------------------------
async def _native(c: httpx.AsyncClient, prompt: str, stream: bool) -> str:
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True},
            "stream": stream}
    if not stream:
        r = await c.post("/generate", json=body)
        assert r.status_code == 200, r.text
        return r.json()["text"]
    text = None
    async with c.stream("POST", "/generate", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                text = json.loads(line[5:])["text"]
    return text


async def _openai(c: httpx.AsyncClient, prompt: str, stream: bool) -> str:
    body = {"prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": True, "stream": stream}
    if not stream:
        r = await c.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]
    text = ""
    async with c.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                text += json.loads(line[5:])["choices"][0]["text"]
    return text


def test_32_concurrent_requests(server):
    prompts = [f"Request number {i}: once upon a time" for i in range(32)]
    kinds = [(_native, False), (_native, True), (_openai, False), (_openai, True)]

    async def run(concurrent: bool) -> list[str]:
        limits = httpx.Limits(max_connections=64)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as c:
            calls = [kinds[i % 4][0](c, p, kinds[i % 4][1]) for i, p in enumerate(prompts)]
            if concurrent:
                return await asyncio.gather(*calls)
            return [await call for call in calls]

    together = asyncio.run(run(concurrent=True))
    state = server.wait_idle()
    assert state["integrity"] == "ok" and state["num_free_pages"] == state["num_pages"]
    alone = asyncio.run(run(concurrent=False))
    assert together == alone  # batching does not change greedy results


# ---- long prefill vs streaming -------------------------------------------------------------------
async def measure_interference(url: str, long_tokens: int = LONG_PROMPT_TOKENS) -> dict:
    """Stream one request while another sends a long prompt; returns timings in seconds."""
    def ids(seed: int, n: int) -> list[int]:  # a new first token each time: nothing comes from the prefix cache
        return [seed % 300 + 5] + [(i * 7 + seed) % 300 + 5 for i in range(1, n)]

    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        async def prefill(ids) -> float:
            t = time.perf_counter()
            r = await c.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 0}})
            assert r.status_code == 200, r.text
            return time.perf_counter() - t

        await prefill(ids(0, CHUNK))  # warm-up
        chunk_s = statistics.median([await prefill(ids(1 + k, CHUNK)) for k in range(5)])
        long_alone_s = await prefill(ids(10, long_tokens))

        stamps: list[float] = []
        started = asyncio.Event()

        async def stream() -> None:
            body = {"text": "Hello there", "stream": True,
                    "sampling_params": {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True}}
            async with c.stream("POST", "/generate", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data:") and line != "data: [DONE]":
                        stamps.append(time.perf_counter())
                        if len(stamps) == 20:
                            started.set()

        streaming = asyncio.create_task(stream())
        await started.wait()
        t0 = time.perf_counter()
        health: list[float] = []

        async def probe() -> None:
            while True:
                t = time.perf_counter()
                await c.get("/health")
                health.append(time.perf_counter() - t)
                await asyncio.sleep(0.02)

        prober = asyncio.create_task(probe())
        long_busy_s = await prefill(ids(11, long_tokens))
        t1 = t0 + long_busy_s
        prober.cancel()
        await streaming
    before = [b - a for a, b in zip(stamps, stamps[1:]) if b < t0]
    during = [b - a for a, b in zip(stamps, stamps[1:]) if a >= t0 and b <= t1]
    return {"chunk_s": chunk_s, "long_alone_s": long_alone_s, "long_busy_s": long_busy_s,
            "decode_gap_s": statistics.median(before), "tokens_during_prefill": len(during),
            "max_gap_during_s": max(during, default=float("nan")), "health_max_s": max(health, default=0.0),
            "chunks": -(-long_tokens // CHUNK)}


def test_long_prefill_delays_streaming_by_about_one_chunk(server):
    m = asyncio.run(measure_interference(server.url))
    print(describe(m))
    # The scheduler alternates prompt chunks and decode steps: about one streamed token per chunk. A
    # prefill that blocked decoding would leave (almost) no tokens during it and one gap of its full length.
    assert m["tokens_during_prefill"] >= m["chunks"] - 3, describe(m)
    assert m["max_gap_during_s"] < max(0.5 * m["long_busy_s"], 4 * m["chunk_s"]), describe(m)
    assert m["health_max_s"] < 0.5 * m["long_busy_s"], describe(m)  # the HTTP loop stays responsive


def describe(m: dict) -> str:
    ms = {k: v * 1e3 for k, v in m.items() if k.endswith("_s")}
    return (f"one {CHUNK}-token prefill request {ms['chunk_s']:.1f} ms | {m['chunks']}-chunk prompt alone "
            f"{ms['long_alone_s']:.0f} ms, while streaming {ms['long_busy_s']:.0f} ms | decode gap alone "
            f"{ms['decode_gap_s']:.1f} ms | during the long prefill: {m['tokens_during_prefill']} tokens, max gap "
            f"{ms['max_gap_during_s']:.1f} ms | /health max {ms['health_max_s']:.1f} ms")


if __name__ == "__main__":
    import tempfile

    from server_process import launch

    from hybrid_sgl.server_args import BUNDLED_MODEL

    with tempfile.TemporaryDirectory() as logs:
        srv = launch(BUNDLED_MODEL, logs)
        try:
            print(describe(asyncio.run(measure_interference(srv.url))))
        finally:
            srv.stop()
