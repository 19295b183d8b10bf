"""Markdown report of a bench/offline.py result dict."""

from __future__ import annotations

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
