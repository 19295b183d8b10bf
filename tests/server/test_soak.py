"""Soak: a few hundred mixed requests from concurrent clients that disconnect mid-stream, give up
on a timeout, abort by rid, reuse rids and send n > 1 and batches. No 5xx, no hang, and at the end
the pools pass check_integrity with every page and slot free.

`python tests/server/test_soak.py [requests]` runs it against a fresh server and prints the figures.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import httpx

NUM_REQUESTS = 240
CONCURRENCY = 16
KINDS = ("complete", "stream", "disconnect", "timeout", "abort", "dup_rid", "n_samples", "batch", "openai_stream")


async def _one(c: httpx.AsyncClient, i: int, kind: str, rng: random.Random, figures: Counter) -> None:
    params = {"max_new_tokens": rng.randint(1, 40), "temperature": rng.choice([0, 0.7]), "ignore_eos": True}
    body = {"text": f"Soak request {i}", "sampling_params": params, "rid": f"soak-{i % 40}"}
    if kind == "complete":
        r = await c.post("/generate", json=body)
        figures[r.status_code] += 1
    elif kind == "dup_rid":  # a second request under the rid of one that is streaming
        first = {**body, "rid": f"dup-{i}", "stream": True, "sampling_params": {**params, "max_new_tokens": 200}}
        async with c.stream("POST", "/generate", json=first) as r:
            figures[r.status_code] += 1
            lines = r.aiter_lines()  # kept open: a finalized iterator closes the connection (a disconnect)
            first_line = await anext(lines)
            while not first_line.startswith("data:"):
                first_line = await anext(lines)
            second = await c.post("/generate", json={**body, "rid": f"dup-{i}"})
            figures[second.status_code] += 1
            assert second.status_code == 409, (first_line, second.text)
            await lines.aclose()
    elif kind == "n_samples":
        r = await c.post("/generate", json={**body, "sampling_params": {**params, "n": rng.randint(2, 4)}})
        figures[r.status_code] += 1
    elif kind == "batch":
        r = await c.post("/generate", json={**body, "text": [f"b{i}", f"c{i}", f"d{i}"]})
        figures[r.status_code] += 1
    elif kind in ("stream", "disconnect", "openai_stream"):
        path, payload = "/generate", {**body, "stream": True}
        if kind == "disconnect":
            payload["sampling_params"] = {**params, "max_new_tokens": 60}
        if kind == "openai_stream":
            path, payload = "/v1/completions", {"prompt": f"Soak {i}", "max_tokens": 30, "stream": True,
                                                "rid": f"soak-{i % 40}"}
        leave_after = rng.randint(1, 5) if kind == "disconnect" else None
        async with c.stream("POST", path, json=payload) as r:
            figures[r.status_code] += 1
            n = 0
            async for line in r.aiter_lines():
                n += line.startswith("data:")
                if leave_after is not None and n >= leave_after:
                    figures["disconnected"] += 1
                    break
    elif kind == "timeout":
        long = {**body, "sampling_params": {**params, "max_new_tokens": 500}}
        try:
            r = await c.post("/generate", json=long, timeout=rng.uniform(0.05, 0.4))
            figures[r.status_code] += 1
        except httpx.TimeoutException:
            figures["timed_out"] += 1
    elif kind == "abort":
        long = {**body, "sampling_params": {**params, "max_new_tokens": 400, "n": 2}}
        task = asyncio.ensure_future(c.post("/generate", json=long))
        await asyncio.sleep(rng.uniform(0.0, 0.2))
        figures[(await c.post("/abort_request", json={"rid": body["rid"]})).status_code] += 1
        figures[(await task).status_code] += 1


async def soak(url: str, num_requests: int = NUM_REQUESTS, seed: int = 0) -> Counter:
    rng = random.Random(seed)
    plan = [(i, rng.choice(KINDS)) for i in range(num_requests)]
    figures: Counter = Counter()
    queue: asyncio.Queue = asyncio.Queue()
    for item in plan:
        queue.put_nowait(item)
    limits = httpx.Limits(max_connections=CONCURRENCY * 2)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:
        async def worker(w: int) -> None:
            wrng = random.Random(seed * 1000 + w)
            while not queue.empty():
                i, kind = queue.get_nowait()
                figures[kind] += 1
                await _one(c, i, kind, wrng, figures)

        await asyncio.wait_for(asyncio.gather(*(worker(w) for w in range(CONCURRENCY))), 600)
    return figures


def test_soak_leaves_no_5xx_no_hang_and_free_pools(server):
    tasks_before = server.wait_idle()["asyncio_tasks"]
    figures = asyncio.run(soak(server.url))
    print(f"\nsoak: {dict(sorted(figures.items(), key=str))}")
    assert not [s for s in figures if isinstance(s, int) and s >= 500], figures
    assert set(s for s in figures if isinstance(s, int)) <= {200, 409}, figures
    assert figures["disconnected"] > 0 and figures["timed_out"] > 0 and figures[409] > 0, figures
    state = server.wait_idle(timeout=30)
    assert state["integrity"] == "ok", state
    assert state["num_running_reqs"] == 0 and state["num_waiting_reqs"] == 0, state
    assert state["num_free_slots"] == state["num_slots"] and state["num_free_pages"] == state["num_pages"], state
    assert state["open_sinks"] == 0 and state["reserved_rids"] == 0, state
    assert state["asyncio_tasks"] <= tasks_before, (tasks_before, state)  # no watcher or stream task left
    r = httpx.post(server.url + "/generate", json={"text": "after", "rid": "soak-1",
                                                   "sampling_params": {"max_new_tokens": 2}}, timeout=30)
    assert r.status_code == 200  # every soak rid is free again


if __name__ == "__main__":
    import sys
    import tempfile

    from server_process import launch

    from hybrid_sgl.server_args import BUNDLED_MODEL

    with tempfile.TemporaryDirectory() as logs:
        srv = launch(BUNDLED_MODEL, logs)
        try:
            print(dict(asyncio.run(soak(srv.url, int(sys.argv[1]) if len(sys.argv) > 1 else NUM_REQUESTS))))
            print(srv.wait_idle(timeout=30))
        finally:
            srv.stop()
