"""Question: how much faster does speculative decoding (NEXTN, k = 3 drafts) decode than plain decoding,
at batch 1 and at high concurrency, at a measured accept length?

    PYTHONPATH=$PWD python bench/spec_decode.py --config configs/qwen3_5-9b-text --out spec.json \
        [--accept 0.81] [--batch 1,64] [--prompt 512] [--output 128]

Each case runs in its own process (a fresh device), with decode graphs up to its batch and no prefill
graphs (prefill is left out of the rate; each capture costs start-up time): first plain decoding, whose
greedy tokens are the truth, then the same requests with --speculative-algorithm NEXTN. With a trained MTP layer (the
bundled default model) the drafts are the layer's own (--accept none). With dummy weights (the real
shapes) the MTP layer is random, so a TEST-ONLY drafter sets the acceptance: the MTP layer still runs
every draft pass (its cost is paid), then each proposed token is replaced by the true next token with
probability --accept (a wrong one otherwise). At --accept p the expected tokens a verify row gains are
1 + p + p^2 + p^3 (p = 0.81: about 3). The accept length reported is the engine's measured one.

Reported per batch: decode tok/s (output tokens after the first / the wall time of the run less that
of the same prompts with one new token, the prefix cache off: prefill is left out), spec / plain, the
measured accept length, and whether the spec run's greedy tokens equal the plain run's (bf16 batch
shapes differ between verify and decode steps, so near-ties of random weights may flip; the count of
equal requests is reported).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(ROOT, "configs", "qwen3_5-9b-text"))
    p.add_argument("--batch", default="1,64")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--output", type=int, default=128)
    p.add_argument("--accept", default="0.81",
                   help="the test-only drafter's per-token acceptance, or none (the MTP layer's own drafts)")
    p.add_argument("--dummy", action="store_true", help="random weights (default for the configs/ shapes)")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default=None)
    p.add_argument("--run", default=None, help=argparse.SUPPRESS)  # internal: one case in this process
    return p.parse_args(argv)


def prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    rng = random.Random(batch * 1000 + length)
    return [[rng.randrange(10, vocab - 10) for _ in range(length)] for _ in range(batch)]


def _key(prompt: list[int]) -> str:
    return ",".join(map(str, prompt))


def run_case(a: argparse.Namespace) -> dict:
    """One (batch, spec on / off) case in this process."""
    from hybrid_sgl import Engine
    from hybrid_sgl.config import ModelConfig
    from hybrid_sgl.runner.speculative import SpecDecoder

    batch, spec = a.run.split(":")
    batch, spec = int(batch), spec == "spec"
    config = ModelConfig.from_hf(a.config)
    ids = prompts(batch, a.prompt, config.vocab_size)
    kw = dict(model_path=a.config, device=a.device, log_level="warning", skip_tokenizer_init=True,
              context_length=a.prompt + a.output + 8, max_running_requests=max(batch, 1), random_seed=0,
              disable_radix_cache=True, cuda_graph_max_bs=max(batch, 1), cuda_graph_max_tokens=0)
    if a.dummy:
        kw["load_format"] = "dummy"
    truth_file = f"{a.out or 'spec'}.truth.b{batch}.json"
    if spec:
        kw.update(speculative_algorithm="NEXTN", speculative_num_steps=3, speculative_eagle_topk=1,
                  speculative_num_draft_tokens=4)
        if a.accept != "none":
            with open(truth_file) as f:
                truth = json.load(f)
            p, rng, original = float(a.accept), random.Random(0), SpecDecoder.draft

            def test_only_draft(self, entries):  # the MTP passes run; their tokens are replaced
                proposed = original(self, entries)
                out = []
                for e, own in zip(entries, proposed):
                    future = truth.get(_key(e.req.prompt_ids))
                    if future is None:  # the warm-up request: the MTP layer's own drafts
                        out.append(own)
                        continue
                    future = future[len(e.req.output_ids):]
                    out.append([t if rng.random() < p else (t + 1) % config.vocab_size for t in future[:e.want]]
                               + [1] * max(0, e.want - len(future)))
                return out

            SpecDecoder.draft = test_only_draft
    params = {"max_new_tokens": a.output, "temperature": 0, "ignore_eos": True}
    with Engine(**kw) as engine:
        engine.generate(input_ids=[ids[0][:64]], sampling_params={**params, "max_new_tokens": 8})  # warm-up
        rids = [f"r{i}" for i in range(batch)]
        # decode time = the whole run's wall time - that of the same prompts with one new token (the cache is
        # off, so both prefill alike)
        start = time.perf_counter()
        engine.generate(input_ids=ids, sampling_params={**params, "max_new_tokens": 1})
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        outs = engine.generate(input_ids=ids, sampling_params=params, rid=rids)
        wall_s = time.perf_counter() - start
        decoded = sum(len(o["output_ids"]) - 1 for o in outs)
        stats = engine.stats()
    tokens = [o["output_ids"] for o in outs]
    result = {"batch": batch, "spec": spec, "decode_tok_s": decoded / (wall_s - prefill_s), "wall_s": wall_s,
              "prefill_s": prefill_s,
              "accept_length": stats.get("avg_spec_accept_length"), "tokens": dict(zip(rids, tokens))}
    if not spec:
        with open(truth_file, "w") as f:
            json.dump({_key(prompt): out for prompt, out in zip(ids, tokens)}, f)
    return result


def main() -> None:
    a = parse_args()
    if a.run:
        print("RESULT " + json.dumps(run_case(a)), flush=True)
        return
    if a.config.startswith(os.path.join(ROOT, "configs")) or a.config.startswith("configs/"):
        a.dummy = a.dummy or not os.path.exists(os.path.join(a.config, "model.safetensors"))
    rows = []
    for batch in (int(b) for b in a.batch.split(",")):
        case = {}
        for mode in ("plain", "spec"):
            cmd = [sys.executable, __file__, "--config", a.config, "--prompt", str(a.prompt), "--output", str(a.output),
                   "--accept", a.accept, "--device", a.device, "--out", a.out or "spec", "--run", f"{batch}:{mode}"]
            if a.dummy:
                cmd.append("--dummy")
            proc = subprocess.run(cmd, capture_output=True, text=True)
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not line:
                print(proc.stdout[-3000:], proc.stderr[-3000:])
                raise SystemExit(f"batch {batch} {mode} failed")
            case[mode] = json.loads(line[0][len("RESULT "):])
        plain, spec = case["plain"], case["spec"]
        same = sum(spec["tokens"][r] == plain["tokens"][r] for r in plain["tokens"])
        row = {"batch": batch, "plain_tok_s": round(plain["decode_tok_s"], 1),
               "spec_tok_s": round(spec["decode_tok_s"], 1),
               "speedup": round(spec["decode_tok_s"] / plain["decode_tok_s"], 3),
               "accept_length": round(spec["accept_length"] or 0, 3), "greedy_equal": f"{same}/{batch}"}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"\n# Speculative decoding, {a.config}, prompt {a.prompt}, {a.output} out, drafts: "
          f"{'MTP layer' if a.accept == 'none' else f'TEST-ONLY acceptance {a.accept} (MTP passes still run)'}\n")
    print("| batch | plain tok/s | spec tok/s | spec / plain | accept length | greedy equal |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch']} | {r['plain_tok_s']} | {r['spec_tok_s']} | {r['speedup']}x | {r['accept_length']} "
              f"| {r['greedy_equal']} |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"config": a.config, "accept": a.accept, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
