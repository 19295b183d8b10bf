"""Question: where does a decode step's device time go, kernel by kernel?

Where a decode step's device time goes: per-kernel totals of a decode run, under torch.profiler,
on a `configs/` model with dummy weights. The gap between the sum of kernel times and the step time
measured by bench/offline.py is launch gaps (inside the CUDA graph) and host time.

    PYTHONPATH=$PWD python bench/decode_profile.py --config configs/qwen3_5-9b-text --batch 1

Profiling runs the decode eagerly by default (kernels are the same as in the graph; CUPTI does not
see inside every graph replay); --graphs keeps the CUDA graphs. Prints the top kernels by device
time per decode step, their share of the step, and the kernel count per step. --shapes (eager only)
adds the matmuls that reach cuBLAS by their input shapes, so each cuBLAS kernel has its layer.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.offline import parse_key_value  # noqa: E402
from hybrid_sgl import Engine  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "qwen3_5-9b-text"))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens (small: the profile is about decode)")
    p.add_argument("--steps", type=int, default=32, help="decode steps profiled")
    p.add_argument("--graphs", action="store_true", help="keep decode CUDA graphs")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--tp-size", type=int, default=1, help="rank 0's kernels, all-reduces included")
    p.add_argument("--shapes", action="store_true", help="also the matmul ops by input shape (eager only)")
    p.add_argument("--sampling", action="append", default=[], metavar="KEY=VALUE",
                   help="sampling parameters of the profiled requests (default greedy), e.g. temperature=0.7")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="more Engine arguments, as bench/offline.py takes them (e.g. quantization=fp8)")
    a = p.parse_args()
    assert not (a.shapes and a.graphs), "--shapes needs the eager decode: graph replays record no ops"
    engine = Engine(model_path=a.config, load_format="dummy", skip_tokenizer_init=True, random_seed=0,
                    context_length=a.prompt + a.steps + 8, max_running_requests=a.batch,
                    disable_cuda_graph=not a.graphs, log_level="warning", tp_size=a.tp_size,
                    **dict(parse_key_value(item) for item in a.engine_arg))
    vocab = engine.model_config.vocab_size
    prompts = [[(7 * i + j) % (vocab - 1) + 1 for j in range(a.prompt)] for i in range(a.batch)]
    params = {"max_new_tokens": a.steps, "temperature": 0, "ignore_eos": True,
              **dict(parse_key_value(item) for item in a.sampling)}
    on_gpu = torch.cuda.is_available()
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    try:
        engine.generate(input_ids=prompts, sampling_params={**params, "max_new_tokens": 4})  # warm-up
        sync()
        activities = [ProfilerActivity.CUDA if on_gpu else ProfilerActivity.CPU]
        if a.shapes and on_gpu:
            activities.append(ProfilerActivity.CPU)
        prof = profile(activities=activities, record_shapes=a.shapes)
        # --shapes: started and stopped on the engine thread, which runs the model (CPU ops are recorded
        # per thread); kernels alone are recorded from here, as before
        start_stop = engine.run_on_engine if a.shapes else (lambda fn: fn(None))
        start_stop(lambda s: prof.start())
        engine.generate(input_ids=prompts, sampling_params=params)
        start_stop(lambda s: (sync(), prof.stop()))
    finally:
        engine.shutdown()
    per_kernel: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in prof.events():  # on CPU (a smoke run): aten ops of every thread instead of kernels
        if e.device_type.name == ("CUDA" if on_gpu else "CPU") and (on_gpu or e.name.startswith("aten::")):
            per_kernel[e.name][0] += e.device_time_total
            per_kernel[e.name][1] += 1
    total_us = max(sum(t for t, _ in per_kernel.values()), 1e-9)  # (0 on CPU)
    count = sum(n for _, n in per_kernel.values())
    extra = "".join(f", {item}" for item in a.sampling + a.engine_arg)
    print(f"# Decode profile: {a.config}, batch {a.batch}, {a.steps} steps, graphs {'on' if a.graphs else 'off'}"
          f"{extra}\n")
    print(f"device kernel time per step: {total_us / a.steps / 1000:.3f} ms over {count / a.steps:.0f} kernels "
          f"(prefill of {a.prompt} tokens included, amortized)\n")
    print("| kernel | ms / step | % | calls / step |\n|---|---|---|---|")
    for name, (t, n) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[: a.top]:
        print(f"| {name[:90]} | {t / a.steps / 1000:.4f} | {100 * t / total_us:.1f} | {n / a.steps:.1f} |")
    if a.shapes:
        print("\n| matmul op | input shapes | device ms / step | calls / step |\n|---|---|---|---|")
        ops = [o for o in prof.key_averages(group_by_input_shape=True)
               if o.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::_scaled_mm", "aten::_scaled_mm_v2")]
        for o in sorted(ops, key=lambda o: -o.device_time_total)[: a.top]:
            ms = o.device_time_total / a.steps / 1000
            print(f"| {o.key} | {o.input_shapes} | {ms:.4f} | {o.count / a.steps:.1f} |")


if __name__ == "__main__":
    main()
