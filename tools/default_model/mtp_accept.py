"""The accept length of the default model's MTP layer, measured with hybrid_sgl's own Engine: greedy
continuations of held-out prompts (validation documents) with speculative decoding on
(--speculative-algorithm NEXTN, 3 chained drafts, top-1, 4 draft tokens) and off, which must be
the same tokens, and the decode speed of both.

    python tools/default_model/mtp_accept.py [--checkpoint configs/default-model] [--mtp OUT/mtp.safetensors]

--mtp serves a checkpoint copy (in a temporary folder) with those `mtp.*` tensors instead of the
checkpoint's own, so that a train_mtp.py run is measured before it is written into the checkpoint.

Accept length: tokens a verify step gains per request with drafts (1.0: no draft accepted, 4.0:
all three drafts and the model's own token), counted by the runtime (runner/speculative.py: tokens
kept over verify rows, Engine.stats()'s avg_spec_accept_length); also shown as SGLang counts it,
completion tokens over verify steps (meta_info spec_verify_ct), which also counts the prompt step's
token and any last plain decode step. Speeds are wall-clock output tokens per second of the whole
batch (all prompts at once) and of single requests one after another, on this machine's device (the
median of --repeats runs)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from token_data import load_documents  # noqa: E402

SPEC = dict(speculative_algorithm="NEXTN", speculative_num_steps=3, speculative_eagle_topk=1,
            speculative_num_draft_tokens=4)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=os.path.join(ROOT, "configs", "default-model"))
    p.add_argument("--mtp", default=None, help="an mtp.safetensors (train_mtp.py --out) to serve instead")
    p.add_argument("--data", default=os.path.join(ROOT, ".data", "default_model"))
    p.add_argument("--prompts", type=int, default=32, help="held-out prompts (one per validation document)")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--offset", type=int, default=64, help="where in its document a prompt starts (tokens)")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--sequential", type=int, default=8,
                   help="prompts also run one at a time, for the single-request speed")
    p.add_argument("--repeats", type=int, default=3, help="timed runs of each speed; the median is reported")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--json", default=None, help="write the results here too")
    p.add_argument("--token-map", default=None,
                   help="--speculative-token-map for the drafts (tools/token_map.py), in the spec-on run")
    return p.parse_args(argv)


def held_out_prompts(tokenizer, data: str, count: int, length: int, offset: int) -> list[list[int]]:
    """`length` tokens from `offset` of `count` validation documents, spread over the split."""
    docs = load_documents(os.path.join(data, "validation.jsonl"))
    long_enough = [ids for ids in (tokenizer(d["text"], add_special_tokens=False)["input_ids"] for d in docs)
                   if len(ids) >= offset + length]
    assert len(long_enough) >= count, f"only {len(long_enough)} validation documents hold {offset + length} tokens"
    prompts = [long_enough[i * len(long_enough) // count][offset:offset + length] for i in range(count)]
    return prompts[:count]


def checkpoint_with(checkpoint: str, mtp_file: str, folder: str) -> str:
    """A copy of `checkpoint` in `folder` whose mtp.* tensors are mtp_file's (bf16, as shipped)."""
    from safetensors.torch import load_file, save_file

    for name in os.listdir(checkpoint):
        if name not in ("model.safetensors", "config.json"):
            src = os.path.join(checkpoint, name)
            if os.path.isfile(src):
                shutil.copy(src, folder)
    model = {k: v for k, v in load_file(os.path.join(checkpoint, "model.safetensors")).items()
             if not k.startswith("mtp.")}
    mtp = {k: v.to(torch.bfloat16) for k, v in load_file(mtp_file).items()}
    save_file({**model, **mtp}, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(checkpoint, "config.json")) as f:
        config = json.load(f)
    config["mtp_num_hidden_layers"] = 1
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return folder


def run(path: str, prompts: list[list[int]], args, spec: bool) -> dict:
    """Greedy continuations of prompts (one batch) with NEXTN on or off, the accept counts of that batch,
    and the median speed of --repeats timed runs of the batch and of --sequential single requests (the
    prefix cache flushed before each)."""
    from hybrid_sgl.engine import Engine

    params = {"max_new_tokens": args.new_tokens, "temperature": 0, "ignore_eos": True}
    extra = ({**SPEC, "speculative_token_map": args.token_map} if args.token_map else SPEC) if spec else {}
    with Engine(model_path=path, device=args.device, dtype=args.dtype, log_level="warning", **extra) as engine:
        engine.generate(input_ids=prompts[0][:8], sampling_params={**params, "max_new_tokens": 8})  # warm-up
        sd = engine.runner.speculative
        rows0, kept0 = (sd.verified_rows, sd.verified_tokens) if spec else (0, 0)
        engine.flush_cache()
        outs = engine.generate(input_ids=prompts, sampling_params=params)
        result = {"output_ids": [o["output_ids"] for o in outs], "texts": [o["text"] for o in outs]}
        if spec:
            result["verify_rows"] = sd.verified_rows - rows0
            result["accept_length"] = (sd.verified_tokens - kept0) / max(1, sd.verified_rows - rows0)
            result["engine_avg_spec_accept_length"] = engine.stats()["avg_spec_accept_length"]  # with the warm-up
            verify = sum(o["meta_info"]["spec_verify_ct"] for o in outs)
            result["tokens_per_verify_ct"] = sum(len(o["output_ids"]) for o in outs) / max(1, verify)
            result["per_prompt"] = [round(len(o["output_ids"]) / max(1, o["meta_info"]["spec_verify_ct"]), 2)
                                    for o in outs]
        batch, single = [], []
        for _ in range(args.repeats):
            engine.flush_cache()
            start = time.perf_counter()
            n = sum(len(o["output_ids"]) for o in engine.generate(input_ids=prompts, sampling_params=params))
            batch.append(n / (time.perf_counter() - start))
            if args.sequential:
                engine.flush_cache()
                start = time.perf_counter()
                n = sum(len(engine.generate(input_ids=p, sampling_params=params)["output_ids"])
                        for p in prompts[:args.sequential])
                single.append(n / (time.perf_counter() - start))
        result["batch_tok_s"] = statistics.median(batch) if batch else 0.0
        result["single_tok_s"] = statistics.median(single) if single else 0.0
        engine.check_integrity()
    return result


def measure(args) -> dict:
    from transformers import AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    prompts = held_out_prompts(tokenizer, args.data, args.prompts, args.prompt_tokens, args.offset)
    with tempfile.TemporaryDirectory() as tmp:
        path = checkpoint_with(args.checkpoint, args.mtp, tmp) if args.mtp else args.checkpoint
        off = run(path, prompts, args, spec=False)
        on = run(path, prompts, args, spec=True)
    same = [a == b for a, b in zip(on["output_ids"], off["output_ids"])]
    threads = torch.get_num_threads()
    device = (torch.cuda.get_device_name() if args.device == "cuda"
              else f"cpu ({threads} torch thread{'s' if threads > 1 else ''})")
    return {
        "device": device, "dtype": args.dtype, "prompts": len(prompts), "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens, "speculative": SPEC, "token_map": args.token_map,
        "greedy_output_identical": all(same), "identical_prompts": sum(same),
        "accept_length": round(on["accept_length"], 3), "verify_rows": on["verify_rows"],
        "tokens_per_verify_ct": round(on["tokens_per_verify_ct"], 3),
        "engine_avg_spec_accept_length": round(on["engine_avg_spec_accept_length"], 3),
        "accept_length_per_prompt": on["per_prompt"],
        "speed": f"median of {args.repeats} timed runs, prefix cache flushed before each",
        "batch_tok_s": {"off": round(off["batch_tok_s"], 1), "on": round(on["batch_tok_s"], 1)},
        "single_tok_s": {"off": round(off["single_tok_s"], 1), "on": round(on["single_tok_s"], 1),
                         "requests": min(args.sequential, len(prompts))},
        "sample": {"prompt": tokenizer.decode(prompts[0]), "continuation": on["texts"][0]},
    }


def main() -> None:
    args = parse_args()
    r = measure(args)
    print(json.dumps(r, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=2)
    print(f"accept length {r['accept_length']:.2f} of 4 ({r['verify_rows']} verify rows; completion tokens / "
          f"spec_verify_ct {r['tokens_per_verify_ct']:.2f}); greedy output identical with NEXTN on and off: "
          f"{r['greedy_output_identical']} ({r['identical_prompts']}/{r['prompts']}); {r['device']}: "
          f"batch of {r['prompts']} {r['batch_tok_s']['off']} -> {r['batch_tok_s']['on']} tok/s, single requests "
          f"{r['single_tok_s']['off']} -> {r['single_tok_s']['on']} tok/s (off -> on)")
    if not r["greedy_output_identical"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
