"""Host time against device time for each kind of step, with CUDA graphs on and off in one process.

    PYTHONPATH=$PWD python bench/step_profile.py --config configs/qwen3_5-9b-text [--out result.json]

Runs ModelRunner.run directly (no scheduler, dummy weights) on fixed step shapes:
decode at batch 1 and 32 (512 tokens of context), an extend of 64 tokens after 4,096 cached, prefill
chunks of 512 / 2,048 / 8,192 tokens, and an extend of 8 requests x 256 tokens after 1,024 cached
each (the multi-turn shape; the scheduler never mixes decode and prefill rows in one step). Per case
and per mode (graphs on / off):
- wall: milliseconds a step, the host waiting for each step to end (what a request sees);
- device: kernel time a step (torch.profiler, the sum of the kernels' durations);
- idle: 1 - device / wall, the share of the step the device waits for the host;
- gc: milliseconds a step of Python's cycle collections inside the timed steps (start-up objects are frozen
  and earlier garbage collected first, as in a server);
- launches: kernels a step;
- "off" runs eagerly with cached launches (triton_kernels/cached_launch.py) on, "off, uncached" with
  every Triton kernel launched through Triton's own per-call path; "on" as the server starts;
- eager mode only: host microseconds a layer spends in its forward, by layer kind (the launch path:
  kernels run asynchronously, so this is the host's cost of issuing them).
On CPU (a smoke run) device time is not measured.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from hybrid_sgl.batch import MAX_CUTS, ForwardMode  # noqa: E402
from hybrid_sgl.config import ModelConfig  # noqa: E402
from hybrid_sgl.runner.cuda_graph import StepGraphs, short_row_shapes  # noqa: E402
from hybrid_sgl.runner.model_runner import BatchItem, ModelRunner  # noqa: E402
from hybrid_sgl.sampling_params import SamplingParams  # noqa: E402
from hybrid_sgl.scheduler.prefix_sharing import cut_points  # noqa: E402
from hybrid_sgl.scheduler.request import Req  # noqa: E402
from hybrid_sgl.server_args import ServerArgs  # noqa: E402
from triton_kernels import cached_launch  # noqa: E402

# name: (mode, requests, cached tokens each, new tokens each)
CASES = {
    "decode b1": (ForwardMode.DECODE, 1, 512, 1),
    "decode b32": (ForwardMode.DECODE, 32, 512, 1),
    "extend 64 after 4k": (ForwardMode.EXTEND, 1, 4096, 64),
    "prefill 512": (ForwardMode.EXTEND, 1, 0, 512),
    "prefill 2k": (ForwardMode.EXTEND, 1, 0, 2048),
    "prefill 8k": (ForwardMode.EXTEND, 1, 0, 8192),
    "extend 8x256 after 1k": (ForwardMode.EXTEND, 8, 1024, 256),
}
CUT_EVERY = {"prefill 2k with 8 cuts": 256}  # name: tokens between snapshot cuts (recurrent state copies)
CASES["prefill 2k with 8 cuts"] = CASES["prefill 2k"]
# speculative verify steps: a row of the token and 3 drafts, the state cut after each of the first 3
# (runner/speculative.py), against "decode b1" / "decode b32" (logits of the last row only here)
VERIFY = {"verify 4 b1": (ForwardMode.EXTEND, 1, 512, 4), "verify 4 b32": (ForwardMode.EXTEND, 32, 512, 4)}
CASES.update(VERIFY)
# a cold 4k prompt with and without the prefix cache's default cuts (scheduler/prefix_sharing.py)
CASES["prefill 4k"] = CASES["prefill 4k default cuts"] = (ForwardMode.EXTEND, 1, 0, 4096)
# the step of the unrelated-prompts workload (8 cold 1k prompts), with and without those cuts
CASES["prefill 8x1k"] = CASES["prefill 8x1k default cuts"] = (ForwardMode.EXTEND, 8, 0, 1024)


def make_items(runner: ModelRunner, mode: ForwardMode, n: int, cached: int, new: int, scale: float,
               cut_every: int = 0, verify: bool = False, default_cuts: bool = False) -> list:
    """n requests holding slots and pages for cached + new tokens; their KV and state are whatever
    the pools hold (timing only). cut_every > 0: a snapshot cut every that many new tokens; verify: a
    cut after each new token but the last; default_cuts: the prefix cache's default positions."""
    cached, new = int(cached * scale), max(1, int(new * scale)) if mode is ForwardMode.EXTEND else 1
    vocab = runner.config.vocab_size
    items = []
    for i in range(n):
        slot = runner.allocator.alloc_slot()
        runner.allocator.grow(slot, cached + new)
        req = Req(rid=f"r{i}", prompt_ids=[(7 * i + j) % (vocab - 1) + 1 for j in range(cached + new)],
                  params=SamplingParams(temperature=0, max_new_tokens=16))
        req.slot = slot
        points = range(cached + cut_every, cached + new + 1, cut_every) if cut_every else ()
        if verify:
            points = range(cached + 1, cached + new)
        if default_cuts:
            points = sorted(set(cut_points(cached, cached + new, None)) | {cached + new - 1})[-MAX_CUTS:]
        cuts = [(p, runner.allocator.alloc_snapshot()) for p in points]
        items.append(BatchItem(req=req, start=cached, end=cached + new, sample=True, snapshots=cuts))
    return items


def release(runner: ModelRunner, items: list) -> None:
    for it in items:
        runner.allocator.free_slot(it.req.slot)
        for _, index in it.snapshots:
            runner.allocator.free_snapshot(index)


def run_steps(runner, mode, items, steps: int, sync) -> None:
    """`steps` steps back to back, then wait for the device (what each profiler below records)."""
    for _ in range(steps):
        runner.run(mode, items)
    sync()


def time_steps(runner, mode, items, steps: int, sync) -> tuple[float, float]:
    """(wall seconds a step, milliseconds a step of Python's cycle collections inside the timed steps). The
    garbage of what ran before (the profiler's events, the last case) is collected first, as a server has
    no profiler and froze its start-up objects (engine.py): a full collection inside the loop is then one
    the steps themselves brought about."""
    run_steps(runner, mode, items, 2, sync)
    gc.collect()
    with CollectionTimer() as collections:
        start = time.perf_counter()
        for _ in range(steps):
            runner.run(mode, items)
            sync()
        wall = (time.perf_counter() - start) / steps
    return wall, collections.seconds / steps * 1e3


class CollectionTimer:
    """Seconds spent in Python's cycle collections while the block runs (gc.callbacks)."""

    def __enter__(self):
        self.seconds, self._start = 0.0, None
        gc.callbacks.append(self._on)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._on)

    def _on(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.seconds += time.perf_counter() - self._start


def kernel_profile(runner, mode, items, steps: int, sync, top: int = 0) -> tuple[float, float, list]:
    """(device ms a step, kernels a step, the `top` kernels by device time: [name, ms a step, calls a
    step]) from torch.profiler."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run_steps(runner, mode, items, steps, sync)
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in kernels:
        by_name[e.name][0] += e.device_time_total / 1e3 / steps
        by_name[e.name][1] += 1 / steps
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return (sum(e.device_time_total for e in kernels) / 1e3 / steps, len(kernels) / steps,
            [[name[:90], round(ms, 4), round(n, 1)] for name, (ms, n) in ranked])


def host_profile(runner, mode, items, steps: int, sync, limit: int = 45) -> str:
    """cProfile of `steps` eager steps: the functions with the most host time of their own, then by
    cumulative time (what the launch path and the code around it cost)."""
    prof = cProfile.Profile()
    prof.enable()
    run_steps(runner, mode, items, steps, sync)
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(limit)
    stats.sort_stats("cumulative").print_stats(limit)
    return out.getvalue()


def host_ops(runner, mode, items, steps: int, sync, top: int, on_gpu: bool) -> list:
    """The `top` host-side operations of `steps` eager steps by their own CPU time, from torch.profiler: aten ops
    and, on CUDA, the runtime and driver calls (cudaLaunchKernel, cuLaunchKernel, cudaMemcpyAsync ...), which
    cProfile sees only as part of the C call that makes them. [name, us a step, calls a step]."""
    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if on_gpu else [ProfilerActivity.CPU]
    with profile(activities=activities) as prof:
        run_steps(runner, mode, items, steps, sync)
    ranked = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    return [[e.key[:90], round(e.self_cpu_time_total / steps, 1), round(e.count / steps, 1)] for e in ranked]


class LayerHostTimer:
    """Host time each layer's forward takes, by layer kind (forward hooks, no sync)."""

    def __init__(self, runner: ModelRunner):
        self.totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
        self.handles = []
        for layer, (mixer, ffn) in zip(runner.model.layers, runner.config.layer_plan):
            kind = f"{mixer}+{ffn}"
            starts = []
            self.handles.append(layer.register_forward_pre_hook(lambda *_, s=starts: s.append(time.perf_counter())))
            self.handles.append(layer.register_forward_hook(
                lambda *_, s=starts, k=kind: self._add(k, time.perf_counter() - s.pop())))

    def _add(self, kind: str, seconds: float) -> None:
        self.totals[kind][0] += seconds
        self.totals[kind][1] += 1

    def remove(self) -> dict[str, float]:
        for h in self.handles:
            h.remove()
        return {k: round(t / n * 1e6, 1) for k, (t, n) in self.totals.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "qwen3_5-9b-text"))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every token count (small for smoke runs)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--host-profile", default=None, help="write a cProfile of each case's eager steps here")
    p.add_argument("--top-kernels", type=int, default=0, help="report each case's N kernels with the most device time")
    p.add_argument("--host-ops", type=int, default=0,
                   help="each eager case's N host ops (aten, CUDA runtime and driver calls) of most own CPU time")
    a = p.parse_args()
    names = [n.strip() for n in a.cases.split(",")]
    on_gpu = torch.cuda.is_available() and a.device != "cpu"
    config = ModelConfig.from_hf(a.config)
    context = min(int(8192 * max(a.scale, 1 / 8)) + 64, config.context_length)
    args = ServerArgs(model_path=a.config, load_format="dummy", skip_tokenizer_init=True, random_seed=0,
                      context_length=context, max_running_requests=33, disable_radix_cache=False, device=a.device,
                      dtype=a.dtype, log_level="warning").resolved()
    runner = ModelRunner(args, config)
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    if runner.graphs is not None and runner.verify_graphs is None and any(n in VERIFY for n in names):
        # the verify graphs a speculative server captures (k = 3 drafts: rows of 4 tokens), up to batch 32
        runner.verify_graphs = StepGraphs(model=runner.model, inputs=runner.inputs, mode=ForwardMode.EXTEND,
                                          shapes=short_row_shapes(32, 4), short_rows=True)
        runner.verify_graphs.capture()
    # "off, uncached": eager with every Triton kernel launched through Triton's own per-call path
    # (triton_kernels/cached_launch.py off): what the cached launches save
    graphs = {"on": (runner.graphs, runner.extend_graphs, runner.verify_graphs), "off": (None, None, None),
              "off, uncached": (None, None, None)}
    launches_at_start = cached_launch.ENABLED
    gc.collect()  # the start-up objects leave the collector's passes, as the engine does before serving
    gc.freeze()
    results = {"config": a.config, "device": torch.cuda.get_device_name() if on_gpu else "cpu",
               "cuda_graph_max_tokens": args.cuda_graph_max_tokens, "cases": {}}
    for name in names:
        mode, n, cached, new = CASES[name]
        if int(cached * a.scale) + max(1, int(new * a.scale)) > runner.context_length:
            print(f"{name}: skipped, longer than the model's context ({runner.context_length})")
            continue
        if name in VERIFY:
            cached = int(cached / a.scale)  # the drafts' row keeps its 4 tokens at any scale
            new = int(new / a.scale)
        items = make_items(runner, mode, n, cached, new, a.scale, int(CUT_EVERY.get(name, 0) * a.scale),
                           verify=name in VERIFY, default_cuts=name.endswith("default cuts"))
        row = {}
        for label, (decode, extend, verify) in graphs.items():
            if label == "on" and decode is None:
                continue  # no graphs here (CPU, or a torch backend)
            runner.graphs, runner.extend_graphs, runner.verify_graphs = decode, extend, verify
            cached_launch.ENABLED = label != "off, uncached"
            wall, gc_ms = time_steps(runner, mode, items, a.steps, sync)
            entry = {"wall_ms": round(wall * 1e3, 3), "gc_ms": round(gc_ms, 3)}
            if on_gpu:
                device_ms, launches, top = kernel_profile(runner, mode, items, a.steps, sync, a.top_kernels)
                entry.update(device_ms=round(device_ms, 3), launches=round(launches, 1),
                             idle=round(max(0.0, 1 - device_ms / (wall * 1e3)), 3))
                if top:
                    entry["top_kernels"] = top
            if label == "off":
                run_steps(runner, mode, items, 1, sync)  # first: the profiler before it leaves host work behind
                timer = LayerHostTimer(runner)
                run_steps(runner, mode, items, a.steps, sync)
                entry["host_us_per_layer"] = timer.remove()
                if a.host_ops:
                    entry["host_ops"] = host_ops(runner, mode, items, a.steps, sync, a.host_ops, on_gpu)
                if a.host_profile:
                    with open(a.host_profile, "a") as f:
                        f.write(f"\n######## {name}, graphs off\n" + host_profile(runner, mode, items, a.steps, sync))
            row[label] = entry
        runner.graphs, runner.extend_graphs, runner.verify_graphs = graphs["on"]
        cached_launch.ENABLED = launches_at_start
        release(runner, items)
        results["cases"][name] = row
        print(name, json.dumps(row), flush=True)
    print(report(results))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


def report(results: dict) -> str:
    lines = [f"# Step profile: {results['config']} on {results['device']}", "",
             "| step | graphs | wall ms | gc ms | device ms | idle | launches | eager / graphed wall |",
             "|---|---|---|---|---|---|---|---|"]
    for name, row in results["cases"].items():
        for label, e in row.items():
            ratio = ""
            if label.startswith("off") and "on" in row:
                ratio = f"{e['wall_ms'] / row['on']['wall_ms']:.2f}x"
            lines.append(f"| {name} | {label} | {e['wall_ms']:.3f} | {e.get('gc_ms', '-')} | {e.get('device_ms', '-')} "
                         f"| {e.get('idle', '-')} "
                         f"| {e.get('launches', '-')} | {ratio} |")
    lines += ["", "Host microseconds a layer, eager (by layer kind):", ""]
    for name, row in results["cases"].items():
        lines.append(f"- {name}: {row['off'].get('host_us_per_layer')}")
    for name, row in results["cases"].items():
        if row["off"].get("host_ops"):
            lines += ["", f"Host ops of {name}, eager (name, own CPU us a step, calls a step):", ""]
            lines += [f"- {op}" for op in row["off"]["host_ops"]]
    for name, row in results["cases"].items():
        for label, e in row.items():
            if e.get("top_kernels"):
                lines += ["", f"Kernels of {name}, graphs {label} (name, ms a step, calls a step):", ""]
                lines += [f"- {k}" for k in e["top_kernels"]]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
