"""Question: how long do HTTP requests wait for the server's event loop while the engine thread steps a
batch, at a given GIL switch interval, and what does a shorter interval cost the engine?

    PYTHONPATH=$PWD python bench/http_intake.py [--config configs/default-model] [--intervals 0.005,0.001]

The HTTP event loop and the engine loop share one interpreter (launch_server.py). Per switch interval
(launch_server.SWITCH_INTERVAL_S, set in the server process), one server is started and timed:
- a burst of --burst concurrent light requests (/get_model_info: no engine work), the time until all are
  answered, with the engine idle and while it decodes a batch (medians of --reps bursts);
- that batch's wall time alone and while --clients threads send light requests back to back (the
  engine's cost of serving them), with the light requests answered per second meanwhile.
On CPU the engine runs the Triton kernels in the interpreter (TRITON_INTERPRET=1, float32), a Python-heavy
thread like the launch path of an eager GPU step; on CUDA the served kernels.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import statistics
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from http_client import launched_server  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "default-model"))
    p.add_argument("--intervals", default="0.005,0.001", help="GIL switch intervals (s), one server each")
    p.add_argument("--burst", type=int, default=16)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--batch", type=int, default=4, help="requests of the engine's batch")
    p.add_argument("--new-tokens", type=int, default=24, help="tokens each request of the batch decodes")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default=None)
    return p.parse_args(argv)


def _post(url: str, body: dict) -> bytes:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=3600).read()


def _light(url: str) -> None:
    urllib.request.urlopen(url + "/get_model_info", timeout=600).read()


def burst_ms(url: str, n: int) -> float:
    start = time.perf_counter()
    with cf.ThreadPoolExecutor(n) as pool:
        list(pool.map(lambda _: _light(url), range(n)))
    return 1e3 * (time.perf_counter() - start)


def measure(url: str, a: argparse.Namespace) -> dict:
    body = {"input_ids": [[5 + i] * 16 for i in range(a.batch)],
            "sampling_params": {"max_new_tokens": a.new_tokens, "temperature": 0, "ignore_eos": True}}

    def batch_s() -> float:
        start = time.perf_counter()
        _post(url + "/generate", body)
        return time.perf_counter() - start

    batch_s()  # warm-up: every kernel compiled
    idle = statistics.median(burst_ms(url, a.burst) for _ in range(a.reps))
    alone = batch_s()
    # bursts while the engine decodes the batch (timed alone above: the bursts fit well inside it)
    load = threading.Thread(target=batch_s)
    load.start()
    time.sleep(min(alone / 4, 5.0))
    busy = [burst_ms(url, a.burst) for _ in range(a.reps)]
    overlapped = load.is_alive()
    load.join()
    stop, answered = threading.Event(), [0]

    def client() -> None:
        while not stop.is_set():
            _light(url)
            answered[0] += 1

    clients = [threading.Thread(target=client) for _ in range(a.clients)]
    for t in clients:
        t.start()
    contended = batch_s()
    stop.set()
    for t in clients:
        t.join()
    return {"burst_ms_idle": round(idle, 1), "burst_ms_engine_busy": round(statistics.median(busy), 1),
            "engine_busy_throughout": overlapped, "batch_s_alone": round(alone, 3),
            "batch_s_with_clients": round(contended, 3), "light_requests_per_s": round(answered[0] / contended, 1)}


def main() -> None:
    a = parse_args()
    import torch

    device = a.device if a.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    server = f"--model-path {a.config} --log-level warning --device {device}"
    if device == "cpu":  # a Python-heavy engine thread: the Triton kernels in the interpreter
        os.environ["TRITON_INTERPRET"] = "1"
        server += " --dtype float32 --attention-backend triton --linear-attn-backend triton"
    rows = []
    for interval in (float(x) for x in a.intervals.split(",")):
        launcher = ["-c", "import sys; import hybrid_sgl.launch_server as s; "
                    f"s.SWITCH_INTERVAL_S = {interval}; sys.exit(s.main(sys.argv[1:]))"]
        log = os.path.join(os.environ.get("OUT", "/tmp"), f"http_intake_{interval}.log")
        with launched_server(server, log, 600, launcher=launcher) as url:
            row = {"switch_interval_s": interval, **measure(url, a)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n# HTTP intake while the engine steps, {a.config} on {device}: a burst of {a.burst} light requests; "
          f"a batch of {a.batch} x {a.new_tokens} tokens, alone and beside {a.clients} clients\n")
    print("| switch interval | burst, engine idle ms | burst, engine busy ms | batch alone s | batch beside clients s "
          "| light requests / s meanwhile |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['switch_interval_s'] * 1e3:g} ms | {r['burst_ms_idle']} | {r['burst_ms_engine_busy']} "
              f"| {r['batch_s_alone']} | {r['batch_s_with_clients']} | {r['light_requests_per_s']} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
