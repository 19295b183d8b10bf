"""Question: what decode tok/s (against the roofline) and prefill MFU does the Engine reach on a real model
shape, and how does it compare with HF transformers `generate`?

Offline throughput of the in-process Engine on a real model shape with random weights, against
the ceilings measured in the same run and HF transformers `generate` on the same config (anchor).

    PYTHONPATH=$PWD python bench/offline.py --config configs/qwen3_5-9b-text --out offline.json

Cases: every batch x prompt length, each request generating --output tokens (ignore_eos; greedy unless
--sampling says otherwise).
A case the engine's memory plan cannot hold without preemption is skipped and reported. Every
scheduler step is timed from outside the runtime (bench/step_timing.py), so prefill and decode are
measured on their own steps:
- decode tok/s: tokens of the decode steps that ran the whole batch / their wall time (step start
  to the next step's start); roofline tok/s: the same tokens / (bytes those steps must move /
  measured copy bandwidth), see bench/roofline.py;
- prefill tok/s and MFU: prompt tokens / wall time of the extend steps, FLOPs of those steps /
  their wall time / measured matmul peak;
- step overhead: per decode step, device time of the model forward vs the rest (host_ms); in the
  JSON also each step's times, the 90th percentile and slowest step, and the steps over 1.2x the median with the time
  they add (where a mean-based tok/s parts from the median step).
HF runs for --hf-batches only, after our engine is shut down and freed.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from roofline import measure_ceilings, model_cost  # noqa: E402
from step_timing import StepTimer  # noqa: E402

from hybrid_sgl import Engine  # noqa: E402
from hybrid_sgl.config import ModelConfig  # noqa: E402
from triton_kernels.fastest import choices  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "qwen3_5-9b-text"), help="model directory")
    p.add_argument("--batch", default="1,32,256", help="comma-separated batch sizes")
    p.add_argument("--prompt", default="512,4096", help="comma-separated prompt lengths")
    p.add_argument("--output", type=int, default=256, help="tokens generated per request")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--dtype", default="auto", help="auto: bfloat16 on CUDA, float32 on CPU")
    p.add_argument("--context-length", type=int, default=None, help="default: longest prompt + output")
    p.add_argument("--max-running-requests", type=int, default=None, help="default: the largest batch")
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--chunked-prefill-size", type=int, default=8192)
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="any other Engine / ServerArgs field, e.g. disable_cuda_graph=true (repeatable)")
    p.add_argument("--sampling", action="append", default=[], metavar="KEY=VALUE",
                   help="sampling parameter of every request, e.g. temperature=0.7 (repeatable; default greedy)")
    p.add_argument("--skip-hf", action="store_true", help="do not run the HF transformers anchor")
    p.add_argument("--hf-batches", default="1,32", help="batch sizes the HF anchor runs")
    p.add_argument("--hf-decode-tokens", type=int, default=32, help="tokens HF generates to time decode")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    return p.parse_args(argv)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _literal(value: str):
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def make_prompts(vocab: int):
    def prompts(batch: int, length: int, seed: int) -> list[list[int]]:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, vocab, (batch, length), generator=g).tolist()

    return prompts


def parse_key_value(item: str) -> tuple[str, object]:
    """"KEY=VALUE" -> (KEY, VALUE parsed as JSON where it is JSON, else the string)."""
    key, _, value = item.partition("=")
    return key.strip(), _literal(value.strip())


def engine_kwargs(a: argparse.Namespace, device: str, dtype: str, context_length: int) -> dict:
    kw = dict(model_path=a.config, load_format="dummy", skip_tokenizer_init=True, device=device, dtype=dtype,
              context_length=context_length, chunked_prefill_size=a.chunked_prefill_size, random_seed=0,
              log_level="warning", max_running_requests=a.max_running_requests or max(_ints(a.batch)))
    if a.mem_fraction_static is not None:
        kw["mem_fraction_static"] = a.mem_fraction_static
    kw.update(parse_key_value(item) for item in a.engine_arg)
    return kw


def skip_reason(engine, batch: int, prompt: int, output: int) -> str | None:
    plan, runner = engine.runner.plan, engine.runner
    pages = -(-(prompt + output) // plan.page_size) + 1  # + the admission headroom of one page
    if prompt + output > runner.context_length:
        return f"prompt + output = {prompt + output} exceeds the context length {runner.context_length}"
    if batch > plan.max_running_requests:
        return f"batch {batch} exceeds max_running_requests {plan.max_running_requests}"
    if batch * pages > plan.num_pages:
        return f"needs {batch * pages} KV pages, the plan has {plan.num_pages}"
    return None


def _median_ms(values) -> float:
    return 1e3 * statistics.median(values) if values else float("nan")


def decode_summary(records, batch: int, cost, ceilings) -> dict:
    steps = [r for r in records if r.mode == "decode" and r.batch == batch]
    whole_batch = bool(steps)
    steps = steps or [r for r in records if r.mode == "decode"]
    if not steps:
        return {}
    tokens, wall = sum(r.batch for r in steps), sum(r.wall_s for r in steps)
    moved = sum(cost.decode_bytes(r.batch, r.context_tokens) for r in steps)
    roof_s = moved / ceilings.copy_bytes_per_s
    medians = {f"{name}_ms": _median_ms([getattr(r, attr) for r in steps]) for name, attr in (
        ("step", "wall_s"), ("forward", "forward_s"), ("host", "host_s"), ("schedule", "schedule_s"),
        ("build", "build_s"), ("run_host", "run_s"))}
    walls = sorted(r.wall_s for r in steps)
    median = statistics.median(walls)
    slow = [w for w in walls if w > 1.2 * median]  # steps that pull the mean off the median
    return {"steps": len(steps), "whole_batch": whole_batch, "tok_s": tokens / wall,
            "roofline_tok_s": tokens / roof_s, "roofline_fraction": roof_s / wall,
            "bytes_per_step": moved / len(steps), **medians,
            "step_p90_ms": 1e3 * walls[int(0.9 * (len(walls) - 1))], "step_max_ms": 1e3 * walls[-1],
            "slow_steps": len(slow), "slow_steps_excess_ms": 1e3 * (sum(slow) - len(slow) * median),
            "forward_kind": statistics.mode([r.forward_kind for r in steps]),
            # per step, in order: (wall, forward, schedule, run) ms, to tell a slow step's device time from the host's
            "steps_ms": [[round(1e3 * x, 3) for x in (r.wall_s, r.forward_s, r.schedule_s, r.run_s)] for r in steps]}


def prefill_summary(records, cost, ceilings, start: float) -> dict:
    steps = [r for r in records if r.mode == "extend"]
    if not steps:
        return {}
    tokens, wall = sum(r.new_tokens for r in steps), sum(r.wall_s for r in steps)
    flops = sum(cost.flops(r.new_tokens, r.attn_pairs, r.logit_rows) for r in steps)
    return {"steps": len(steps), "tokens": tokens, "s": wall, "tok_s": tokens / wall, "flops": flops,
            "mfu": flops / wall / ceilings.matmul_flops_per_s, "all_first_tokens_s": steps[-1].end - start}


def run_case(engine, timer, cost, ceilings, prompts, batch: int, prompt: int, output: int,
             sampling: dict | None = None) -> dict:
    params = {"max_new_tokens": output, "ignore_eos": True, "temperature": 0, **(sampling or {})}
    # Warm-up: the prefill chunks of this case (Triton compiles kernel variants on first use, e.g.
    # per number of sequences in a chunk) with two full chunks of these prompts.
    chunk = engine.server_args.chunked_prefill_size
    per_chunk = max(1, chunk // prompt) if chunk > 0 else batch
    engine.generate(input_ids=prompts(min(batch, 2 * per_chunk), prompt, 1000 + batch),
                    sampling_params={**params, "max_new_tokens": min(output, 4)})
    before = engine.run_on_engine(lambda s: s.num_preemptions)
    timer.take()
    ids = prompts(batch, prompt, batch)
    start = time.perf_counter()
    outputs = engine.generate(input_ids=ids, sampling_params=params)
    total = time.perf_counter() - start
    records = timer.take()
    short = [o["meta_info"] for o in outputs if o["meta_info"]["completion_tokens"] != output]
    if short:
        return {"status": "error", "reason": f"{len(short)} requests ended early, e.g. {short[0]['finish_reason']}"}
    return {"status": "ok", "total_s": total, "output_tok_s": batch * output / total,
            "preemptions": engine.run_on_engine(lambda s: s.num_preemptions) - before,
            "decode": decode_summary(records, batch, cost, ceilings),
            "prefill": prefill_summary(records, cost, ceilings, start)}


def _progress(case: dict) -> str:
    if case["status"] != "ok":
        return case["reason"]
    d, p = case["decode"], case["prefill"]
    return (f"decode {d.get('tok_s', 0):.1f} tok/s ({100 * d.get('roofline_fraction', 0):.0f} % of roofline), "
            f"prefill {p.get('tok_s', 0):.0f} tok/s, {case['total_s']:.1f} s")


def run_ours(a: argparse.Namespace, device: torch.device, dtype: str, context_length: int, ceilings,
             save) -> dict:
    """Our engine over all cases; save(partial result) after each case."""
    engine = Engine(**engine_kwargs(a, device.type, dtype, context_length))
    try:
        runner = engine.runner
        cost = model_cost(runner.model, engine.model_config, runner.plan)
        prompts = make_prompts(engine.model_config.vocab_size)
        layers: dict[str, int] = {}
        for line in runner.model.dispatch_plan():
            kind = " ".join(line.split(":", 1)[1].split())
            layers[kind] = layers.get(kind, 0) + 1
        out = {"memory_plan": runner.plan.describe(), "max_running_requests": runner.plan.max_running_requests,
               "max_total_tokens": runner.plan.max_total_tokens, "context_length": runner.context_length,
               "dtype": str(runner.dtype).removeprefix("torch."), "layers": layers,
               "cuda_graph_sizes": [bs for bs, _ in runner.graphs.shapes] if runner.graphs else None,
               "cost": cost.to_dict(), "cases": {}}
        with StepTimer(engine) as timer:
            for prompt in _ints(a.prompt):
                for batch in _ints(a.batch):
                    reason = skip_reason(engine, batch, prompt, a.output)
                    key = f"{batch}x{prompt}"
                    if reason:
                        out["cases"][key] = {"status": "skipped", "reason": reason}
                        continue
                    try:
                        case = run_case(engine, timer, cost, ceilings, prompts, batch, prompt, a.output,
                                        dict(parse_key_value(kv) for kv in a.sampling))
                    except Exception as e:  # reported with the case; the others still run
                        case = {"status": "error", "reason": f"{type(e).__name__}: {e}"}
                    out["cases"][key] = case
                    save(out)
                    print(f"  {key}: {_progress(case)}", flush=True)
        return out
    finally:
        engine.shutdown()


def main(argv=None) -> dict:
    a = parse_args(argv)
    device = torch.device("cuda" if a.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if a.device == "auto" else a.device))
    dtype = a.dtype if a.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    config = ModelConfig.from_hf(a.config)
    page = int(dict(item.partition("=")[::2] for item in a.engine_arg).get("page_size", 16))
    longest = max(_ints(a.prompt)) + a.output
    context_length = a.context_length or min((-(-longest // page) + 1) * page, config.context_length)
    ceilings = measure_ceilings(device)
    result = {"config": os.path.relpath(os.path.abspath(a.config), ROOT), "architecture": config.architecture,
              "device": ceilings.device_name, "torch": torch.__version__, "ceilings": ceilings.to_dict(),
              "output_tokens": a.output, "args": vars(a)}

    def save(partial: dict) -> None:
        if a.out:
            with open(a.out, "w") as f:
                json.dump({**result, "ours": partial, "complete": False}, f, indent=1)

    result["ours"] = run_ours(a, device, dtype, context_length, ceilings, save)
    # which implementation fastest.py chose per shape in the warm-ups (few-token MoE paths, decode GEMMs)
    result["fastest"] = [[repr(key), name] for key, name in choices().items()]
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        result["memory_held_before_hf_gb"] = torch.cuda.memory_allocated(device) / 1e9
    hf_cases = [(b, p) for p in _ints(a.prompt) for b in _ints(a.batch) if b in _ints(a.hf_batches)]
    reason = "--skip-hf" if a.skip_hf else unavailable_reason()
    if reason is None and hf_cases:
        prompts = make_prompts(config.vocab_size)
        result["hf"] = run_hf(a.config, hf_cases, a.hf_decode_tokens, getattr(torch, dtype), device, prompts)
    else:
        result["hf"] = {"skipped": reason or "no case with a batch in --hf-batches"}
    result["complete"] = True
    print(render(result))
    for key, name in result["fastest"]:
        print(f"fastest.py chose {name} for {key}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


# ---- the anchor ------------------------------------------------------------------------------
# HF transformers `generate` on the same config, random weights (`from_config`), same
# dtype and device, in the same process as our runs (after our engine is freed).
#
# Prefill = time to the first token of the batch (`max_new_tokens=1`); decode rate =
# batch * (n - 1) / (t(n tokens) - t(1 token)), so the prefill cancels out. Greedy, no early stop.

FAST_PATH_MODULES = ("fla", "causal_conv1d", "mamba_ssm")  # kernels HF's hybrid models use when importable


def unavailable_reason() -> str | None:
    """None when transformers can be imported, else why not."""
    try:
        import transformers  # noqa: F401
    except Exception as e:  # an ImportError, or a broken install
        return f"transformers is not importable ({type(e).__name__}: {e})"
    return None


def fast_paths() -> dict[str, bool]:
    return {name: importlib.util.find_spec(name) is not None for name in FAST_PATH_MODULES}


def _timed(fn, device: torch.device) -> float:
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda *_: None)
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


def run_hf(config_path: str, cases: list[tuple[int, int]], decode_tokens: int, dtype: torch.dtype,
           device: torch.device, prompts) -> dict:
    """cases: (batch, prompt length); prompts(batch, length, seed) -> token id lists.
    Returns {"version", "fast_paths", "cases": {f"{batch}x{prompt}": {...} or {"error": ...}}}."""
    import transformers as tf

    cfg = tf.AutoConfig.from_pretrained(config_path)
    with torch.device(device):
        model = tf.AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    pad = cfg.pad_token_id if cfg.pad_token_id is not None else 0

    def generate(ids: torch.Tensor, n: int) -> None:
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=pad)

    out = {"version": tf.__version__, "fast_paths": fast_paths(), "class": type(model).__name__, "cases": {}}
    generate(torch.tensor(prompts(1, 16, 0), device=device), 2)  # warm-up
    for batch, length in cases:
        key = f"{batch}x{length}"
        ids = torch.tensor(prompts(batch, length, batch), device=device)
        try:
            generate(ids, 2)  # warm-up at this shape
            t1 = _timed(lambda: generate(ids, 1), device)  # noqa: B023
            tn = _timed(lambda: generate(ids, decode_tokens), device)  # noqa: B023
        except torch.OutOfMemoryError as e:
            out["cases"][key] = {"error": f"out of memory: {str(e).splitlines()[0]}"}
            torch.cuda.empty_cache()
            continue
        out["cases"][key] = {"prefill_s": t1, "prefill_tok_s": batch * length / t1,
                             "decode_tok_s": batch * (decode_tokens - 1) / (tn - t1),
                             "decode_tokens": decode_tokens}
    return out


# ---- the report: Markdown of a result dict ---------------------------------------------------
FORWARD_KINDS = {"graph": "CUDA-graph replay, device time", "eager": "eager forward, device span incl. launch gaps",
                 "host": "forward on the CPU, host time"}


def _f(value, digits: int = 3) -> str:
    if value is None or value != value:  # None or NaN
        return ""
    return f"{value:.{digits}g}" if abs(value) < 10 ** digits else f"{value:.0f}"


def _ratio(ours, theirs) -> str:
    return f"{ours / theirs:.2f}x" if ours and theirs else ""


def render(r: dict) -> str:
    ours, hf, c = r["ours"], r["hf"], r["ceilings"]
    cost = ours["cost"]
    lines = [
        f"# Offline throughput: {r['config']} ({r['architecture']}), random weights, {ours['dtype']}",
        "",
        f"device {c['device_name']} | copy {_f(c['copy_bytes_per_s'] / 1e12)} TB/s (read + write) | matmul "
        f"{c['matmul_shape']} {_f(c['matmul_flops_per_s'] / 1e12)} TFLOP/s | torch {r['torch']}",
        f"model: {_f(cost['total_params'] / 1e9)} B parameters ({_f(cost['weight_bytes'] / 1e9)} GB), "
        f"{_f(cost['active_params'] / 1e9)} B used per token; read every decode step: "
        f"{_f(cost['dense_read_bytes'] / 1e9)} GB"
        + (f" + {_f(cost['expert_bytes'] / 1e6)} MB per distinct routed expert x {cost['moe_layers']} MoE layers "
           f"({cost['num_experts']} experts, top {cost['top_k']})" if cost["moe_layers"] else ""),
        f"KV {cost['kv_bytes_per_token']} B/token, state {cost['state_bytes_per_request'] / 2**20:.2f} MiB/request",
        ours["memory_plan"],
        "layers: " + "; ".join(f"{n} x {kind}" for kind, n in ours["layers"].items())
        + f" | decode CUDA graphs: {ours['cuda_graph_sizes'] or 'off'}",
        _hf_line(hf, r),
        "",
    ]
    ok = {k: v for k, v in ours["cases"].items() if v["status"] == "ok"}
    hf_cases = hf.get("cases", {})
    lines += ["## Decode", "", "| batch | prompt | decode tok/s | roofline tok/s | % of roofline | MB moved / step "
              "| HF decode tok/s | ours / HF |", "|---|---|---|---|---|---|---|---|"]
    for key, case in ok.items():
        d, h = case["decode"], hf_cases.get(key, {})
        batch, prompt = key.split("x")
        note = "" if d.get("whole_batch", True) else " (no whole-batch step)"
        percent = _f(100 * d["roofline_fraction"], 2) if d else ""
        lines.append(f"| {batch} | {prompt} | {_f(d.get('tok_s'))}{note} | {_f(d.get('roofline_tok_s'))} | "
                     f"{percent} | {_f(d.get('bytes_per_step', 0) / 1e6)} | "
                     f"{_f(h.get('decode_tok_s')) or h.get('error', '')} | "
                     f"{_ratio(d.get('tok_s'), h.get('decode_tok_s'))} |")
    lines += ["", "## Prefill", "", "| batch | prompt | prefill tok/s | MFU % | all first tokens s | HF prefill tok/s "
              "| ours / HF |", "|---|---|---|---|---|---|---|"]
    for key, case in ok.items():
        p, h = case["prefill"], hf_cases.get(key, {})
        batch, prompt = key.split("x")
        lines.append(f"| {batch} | {prompt} | {_f(p.get('tok_s'))} | {_f(100 * p.get('mfu', float('nan')), 2)} | "
                     f"{_f(p.get('all_first_tokens_s'))} | {_f(h.get('prefill_tok_s'))} | "
                     f"{_ratio(p.get('tok_s'), h.get('prefill_tok_s'))} |")
    kinds = {case["decode"].get("forward_kind") for case in ok.values() if case["decode"]}
    lines += ["", "## Decode step time (medians over the whole-batch decode steps)", "",
              "forward: " + "; ".join(FORWARD_KINDS.get(k, k) for k in sorted(kinds - {None})) +
              ". host = step - forward: the host time the device waits for (scheduling, batch build, launches, "
              "sampling, bookkeeping; with the overlap scheduler most of it runs during the previous step). "
              "build: StepInputs.fill, or on the graph paths the static-buffer fill + replay launch.", "",
              "| batch | prompt | step ms | forward ms | host ms | schedule ms | build ms | run ms (host, with wait) |",
              "|---|---|---|---|---|---|---|---|"]
    for key, case in ok.items():
        d = case["decode"]
        batch, prompt = key.split("x")
        lines.append(f"| {batch} | {prompt} | {_f(d.get('step_ms'))} | {_f(d.get('forward_ms'))} | "
                     f"{_f(d.get('host_ms'))} | {_f(d.get('schedule_ms'))} | {_f(d.get('build_ms'))} | "
                     f"{_f(d.get('run_host_ms'))} |")
    lines += ["", "## End to end", "", "| batch | prompt | total s | output tok/s | preemptions |",
              "|---|---|---|---|---|"]
    for key, case in ok.items():
        batch, prompt = key.split("x")
        lines.append(f"| {batch} | {prompt} | {_f(case['total_s'])} | {_f(case['output_tok_s'])} | "
                     f"{case['preemptions']} |")
    for status, title in (("skipped", "Skipped (memory plan)"), ("error", "Failed")):
        cases = {k: v["reason"] for k, v in ours["cases"].items() if v["status"] == status}
        if cases:
            lines += ["", f"{title}: " + "; ".join(f"{k}: {why}" for k, why in cases.items())]
    return "\n".join(lines) + "\n"


def _hf_line(hf: dict, r: dict) -> str:
    if "skipped" in hf:
        return f"HF anchor: not run ({hf['skipped']})"
    fast = ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in hf["fast_paths"].items())
    held = r.get("memory_held_before_hf_gb")
    return (f"HF anchor: transformers {hf['version']} {hf['class']}, kernels importable: {fast}; "
            f"decode timed over {r['args']['hf_decode_tokens']} tokens"
            + (f"; {held:.1f} GB still allocated when it started" if held is not None else ""))


if __name__ == "__main__":
    main()
