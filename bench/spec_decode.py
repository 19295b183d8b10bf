"""Question: how much faster does speculative decoding (NEXTN, k = 3 drafts) decode than plain decoding,
at batch 1 and at high concurrency, at a measured accept length?

    PYTHONPATH=$PWD python bench/spec_decode.py --config configs/qwen3_5-9b-text --out spec.json \
        [--accept 0.81] [--batch 1,64] [--prompt 512] [--output 128] [--limits default,0]

Each case runs in its own process (a fresh device), with decode graphs up to its batch and no prefill
graphs (prefill is left out of the rate; each capture costs start-up time): first plain decoding, whose
greedy tokens are the truth, then the same requests with --speculative-algorithm NEXTN. With a trained MTP layer (the
bundled default model) the drafts are the layer's own (--accept none). With dummy weights (the real
shapes) the MTP layer is random and bf16 verify and decode steps may round ties apart, so a TEST-ONLY
harness times the pipeline alone: every step runs as served (MTP passes, verify step, the model's own
greedy check), then each drafted row keeps its first j drafts, j counting successes of probability
--accept in a row, and a last token (tokens that are not the model's: for timing only). At --accept p
a verify row gains 1 + p + p^2 + p^3 tokens on average (p = 0.81: about 3); the accept length
reported is the engine's measured one.

--limits runs the spec side once per --speculative-disable-by-batch-size given (0: drafts at every batch size,
which times the speculative pipeline itself; default: the engine's, above which decode steps are plain), and
--rollbacks once per --speculative-rollback (snapshots, replay) for each.

Reported per batch: decode tok/s (output tokens after the second / the wall time of the run less that
of the same prompts with two new tokens, the prefix cache off: prefill and the MTP layer's pass over the
prompts are left out), spec / plain, the measured accept length, and (with the MTP layer's own drafts)
whether the spec run's greedy tokens equal the plain run's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _token_map_file(spec: str) -> str:
    """A file for --speculative-token-map: `spec` itself, or for top:N a JSON list of ids 0..N-1 (with dummy
    weights which ids does not matter: only how many lm_head rows a draft pass reads)."""
    if not spec.startswith("top:"):
        return spec
    import json
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(list(range(int(spec[4:]))), f)
    return f.name


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "qwen3_5-9b-text"))
    p.add_argument("--batch", default="1,64")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--output", type=int, default=128)
    p.add_argument("--accept", default="0.81",
                   help="the test-only drafter's per-token acceptance, or none (the MTP layer's own drafts)")
    p.add_argument("--dummy", action="store_true", help="random weights (default for the configs/ shapes)")
    p.add_argument("--token-map", default=None,
                   help="--speculative-token-map for the spec runs: a file, or top:N for ids 0..N-1 (dummy weights)")
    p.add_argument("--limits", default="default",
                   help="--speculative-disable-by-batch-size of the spec runs, comma-separated, one spec run each: "
                        "default (the engine's), or N (0: speculate at every batch size)")
    p.add_argument("--rollbacks", default="snapshots",
                   help="--speculative-rollback of the spec runs, comma-separated (snapshots, replay): one run each")
    p.add_argument("--chain", action="store_true",
                   help="the spec runs chain their iterations (the default; without --chain: "
                        "--disable-speculative-overlap)")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default=None)
    p.add_argument("--profile", default=None, help="write a profile of each case's timed run here (appended): "
                   "the engine loop's cProfile and the device's kernels (torch.profiler)")
    p.add_argument("--run", default=None, help=argparse.SUPPRESS)  # internal: one case in this process
    return p.parse_args(argv)


def prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    rng = random.Random(batch * 1000 + length)
    return [[rng.randrange(10, vocab - 10) for _ in range(length)] for _ in range(batch)]


@contextlib.contextmanager
def profiled(path: str | None, title: str, limit: int = 30):
    """Around one timed run: a cProfile of the engine loop's steps (Scheduler.step, on its thread) and a
    torch.profiler trace of the device, summarized into `path` (nothing when None)."""
    if path is None:
        yield
        return
    import cProfile
    import io
    import pstats

    import torch

    from hybrid_sgl.scheduler.scheduler import Scheduler

    prof, step = cProfile.Profile(), Scheduler.step

    def profiled_step(self):
        prof.enable()
        try:
            return step(self)
        finally:
            prof.disable()

    Scheduler.step = profiled_step
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    start = time.perf_counter()
    try:
        with torch.profiler.profile(activities=activities) as trace:
            yield
    finally:
        Scheduler.step = step
    wall = time.perf_counter() - start
    kernels = [e for e in trace.key_averages() if e.device_time_total > 0 and e.device_type.name == "CUDA"]
    busy = sum(e.device_time_total for e in kernels) / 1e3
    text = io.StringIO()
    text.write(f"\n######## {title}: wall {wall * 1e3:.1f} ms, kernels {busy:.1f} ms "
               f"({sum(e.count for e in kernels)} launches)\n")
    for e in sorted(kernels, key=lambda e: -e.device_time_total)[:15]:
        text.write(f"  {e.device_time_total / 1e3:9.2f} ms {e.count:7d}x  {e.key[:90]}\n")
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(limit)
    with open(path, "a") as f:
        f.write(text.getvalue())


def run_case(a: argparse.Namespace) -> dict:
    """One (batch, spec on / off) case in this process."""
    from hybrid_sgl import Engine
    from hybrid_sgl.config import ModelConfig
    from hybrid_sgl.runner.speculative import SpecDecoder
    from hybrid_sgl.runner.step_results import ItemResult

    batch, mode = a.run.split(":", 1)
    mode, _, rollback = mode.partition("@")
    batch, spec = int(batch), mode.startswith("spec")
    config = ModelConfig.from_hf(a.config)
    ids = prompts(batch, a.prompt, config.vocab_size)
    kw = dict(model_path=a.config, device=a.device, log_level="warning", skip_tokenizer_init=True,
              context_length=a.prompt + a.output + 8, max_running_requests=max(batch, 1), random_seed=0,
              disable_radix_cache=True, cuda_graph_max_bs=max(batch, 1), cuda_graph_max_tokens=0)
    if a.dummy:
        kw["load_format"] = "dummy"
    if spec:
        kw.update(speculative_algorithm="NEXTN", speculative_num_steps=3, speculative_eagle_topk=1,
                  speculative_num_draft_tokens=4, speculative_rollback=rollback or "snapshots")
        if a.token_map:
            kw["speculative_token_map"] = _token_map_file(a.token_map)
        if mode != "spec":  # spec:N
            kw["speculative_disable_by_batch_size"] = int(mode.split(":")[1])
        if a.accept != "none":
            p, rng, original = float(a.accept), random.Random(0), SpecDecoder.verify

            def forced_verify(self, items, drafts):  # TEST-ONLY: timing, not the model's tokens
                out = original(self, items, drafts)
                for i, d in enumerate(drafts):
                    if d:
                        j = 0
                        while j < len(d) and rng.random() < p:
                            j += 1
                        out[i] = [ItemResult(next_token=t) for t in d[:j] + [d[j] if j < len(d) else d[-1]]]
                return out

            SpecDecoder.verify = forced_verify
    params = {"max_new_tokens": a.output, "temperature": 0, "ignore_eos": True}
    if spec and not a.chain:
        kw["disable_speculative_overlap"] = True
    with Engine(**kw) as engine:
        chain = getattr(engine.scheduler.pipeline, "chain", None)
        if chain is not None and a.accept != "none":
            chain.forced_acceptance = float(a.accept)  # TEST-ONLY, as forced_verify
            if chain.graphs:  # captured before: again, with the forced acceptance inside
                chain.capture_graphs(sorted({rows for rows, _ in chain.graphs}))  # keys: (rows, sampled)
        engine.generate(input_ids=ids, sampling_params={**params, "max_new_tokens": 8})  # warm-up: every shape
        rids = [f"r{i}" for i in range(batch)]
        # decode time = the whole run's wall time - that of the same prompts with two new tokens (the cache is
        # off, so both prefill alike; with two tokens the requests outlive their prefill, so the MTP layer's
        # pass over the prompts is subtracted too)
        start = time.perf_counter()
        engine.generate(input_ids=ids, sampling_params={**params, "max_new_tokens": 2})
        prefill_s = time.perf_counter() - start
        with profiled(a.profile, f"batch {batch}, {'spec' if spec else 'plain'}"):
            start = time.perf_counter()
            outs = engine.generate(input_ids=ids, sampling_params=params, rid=rids)
            wall_s = time.perf_counter() - start
        decoded = sum(len(o["output_ids"]) - 2 for o in outs)
        stats = engine.stats()
    tokens = [o["output_ids"] for o in outs]
    result = {"batch": batch, "mode": mode, "spec": spec, "decode_tok_s": decoded / (wall_s - prefill_s),
              "wall_s": wall_s, "prefill_s": prefill_s,
              "accept_length": stats.get("avg_spec_accept_length"), "tokens": dict(zip(rids, tokens))}
    return result


def main() -> None:
    a = parse_args()
    if a.run:
        print("RESULT " + json.dumps(run_case(a)), flush=True)
        return
    if a.config.startswith(os.path.join(ROOT, "configs")) or a.config.startswith("configs/"):
        a.dummy = a.dummy or not os.path.exists(os.path.join(a.config, "model.safetensors"))
    rows = []
    spec_modes = [("spec" if x == "default" else f"spec:{int(x)}") + f"@{r}"
                  for x in a.limits.split(",") for r in a.rollbacks.split(",")]
    for batch in (int(b) for b in a.batch.split(",")):
        case = {}
        for mode in ["plain"] + spec_modes:
            cmd = [sys.executable, __file__, "--config", a.config, "--prompt", str(a.prompt), "--output", str(a.output),
                   "--accept", a.accept, "--device", a.device, "--out", a.out or "spec", "--run", f"{batch}:{mode}"]
            if a.profile:
                cmd += ["--profile", a.profile]
            if a.token_map:
                cmd += ["--token-map", a.token_map]
            if a.dummy:
                cmd.append("--dummy")
            if a.chain:
                cmd.append("--chain")
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not line:
                print(proc.stdout[-3000:], proc.stderr[-3000:])
                raise SystemExit(f"batch {batch} {mode} failed")
            case[mode] = json.loads(line[0][len("RESULT "):])
        plain = case["plain"]
        for mode in spec_modes:
            spec = case[mode]
            same = (None if a.accept != "none"
                    else sum(spec["tokens"][r] == plain["tokens"][r] for r in plain["tokens"]))
            limit, _, rollback = mode.partition("@")
            row = {"batch": batch, "limit": "default" if limit == "spec" else int(limit.split(":")[1]),
                   "rollback": rollback,
                   "plain_tok_s": round(plain["decode_tok_s"], 1), "spec_tok_s": round(spec["decode_tok_s"], 1),
                   "speedup": round(spec["decode_tok_s"] / plain["decode_tok_s"], 3),
                   "accept_length": round(spec["accept_length"] or 0, 3),
                   "greedy_equal": "n/a (forced)" if same is None else f"{same}/{batch}"}
            for m, c in (("plain", plain), ("spec", spec)):
                row[f"{m}_wall_s"] = round(c["wall_s"], 3)
                row[f"{m}_prefill_s"] = round(c["prefill_s"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n# Speculative decoding, {a.config}, prompt {a.prompt}, {a.output} out, drafts: "
          f"{'MTP layer' if a.accept == 'none' else f'TEST-ONLY forced acceptance {a.accept} (every pass runs)'}"
          f"{f', token map {a.token_map}' if a.token_map else ''}\n")
    print("| batch | --speculative-disable-by-batch-size | --speculative-rollback | plain tok/s | spec tok/s "
          "| spec / plain | accept length | greedy equal |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['limit']} | {r['rollback']} | {r['plain_tok_s']} | {r['spec_tok_s']} "
              f"| {r['speedup']}x | {r['accept_length']} | {r['greedy_equal']} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"config": a.config, "accept": a.accept, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
