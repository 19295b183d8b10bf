"""Train the multi-token-prediction (MTP) layer of the bundled default model, the draft model of
speculative decoding (--speculative-algorithm NEXTN), with the trained model itself frozen.

    python tools/default_model/train_mtp.py --out OUT [--time-budget-s 1800 | --max-steps N] [--write-checkpoint]
    python tools/default_model/train_mtp.py --merge OUT [--accept-json FILE]    # a finished run into the checkpoint

The shipped layer: --max-steps 750 --threads 1 on a 2-core CPU (33 minutes), the defaults otherwise.

The layer is the one hybrid_sgl/models/mtp.py serves: entry i takes the token x_{i+1} and the model's
final hidden state h_i (after its final norm), at position i, and predicts x_{i+2}:

    e = pre_fc_norm_embedding(embed(x_{i+1})); h = pre_fc_norm_hidden(h_i)
    x = fc(cat(e, h))                      Linear 2H -> H, no bias, the embedding half first
    x = decoder layer(x)                   HF's Qwen3_5DecoderLayer (full attention), causal, rotary positions i
    logits = lm_head(norm(x))              the model's own (tied) lm_head

Built from HF's own Qwen3_5RMSNorm and Qwen3_5DecoderLayer (so the (1 + weight) norm convention and the
weight names are the checkpoint's) and the model's rotary embedding; only this layer trains (AdamW,
linear warmup then cosine decay, random windows of the training corpus as train.py draws them).

The loss of entry i is the cross entropy against x_{i+2}, mixed with --distill-weight of the KL
divergence from the frozen model's own next-token distribution at position i + 1 (the tokens a draft is
checked against at serving time). With --chain-steps K > 1 the loss also covers the chained drafts the
runtime makes (runner/speculative.py): draft s of an anchor i takes the token x_{i+s} and the MTP
layer's own output of draft s - 1 as its hidden state, at position i + s - 1, and attends to the
first-pass entries at positions <= i plus the anchor's own earlier drafts, as the runtime's KV holds
them; its loss weight is --chain-decay^(s - 1).

Printed (and written to OUT/mtp_training.json) before and after training, on validation windows: the
cross entropy against x_{i+2}, the top-1 accuracy against x_{i+2}, and the top-1 agreement with the
frozen model's own greedy token at i + 1 (for each chained draft too). --write-checkpoint merges the
`mtp.*` tensors (bf16) into CHECKPOINT/model.safetensors, sets `mtp_num_hidden_layers: 1` in its
config.json and writes the run's section of its TRAINING.md."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.modules.setdefault("fla", None)  # HF's torch GDN path everywhere, as train.py

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from mtp_layer import MTPLayer, build_mtp, mtp_passes, mtp_tensors, target_pass  # noqa: E402
from token_data import consecutive_windows, load_documents, text_stream  # noqa: E402

SECTION = "## MTP layer"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", help="folder receiving mtp.safetensors (float32) and mtp_training.json")
    p.add_argument("--merge", metavar="OUT", default=None,
                   help="train nothing: write a finished run's OUT/mtp.safetensors (bf16) and its record into "
                        "CHECKPOINT, as --write-checkpoint does")
    p.add_argument("--accept-json", default=None,
                   help="with --merge: mtp_accept.py --json's file, quoted in the TRAINING.md section")
    p.add_argument("--checkpoint", default=os.path.join(ROOT, "configs", "default-model"), help="the frozen model")
    p.add_argument("--data", default=os.path.join(".data", "default_model"), help="prepare_data.py's output")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seq-len", type=int, default=256, help="MTP entries a window (the model reads K more tokens)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-steps", type=int, default=None, help="steps to train (default: from --time-budget-s)")
    p.add_argument("--time-budget-s", type=float, default=1800.0,
                   help="without --max-steps: the step count is set from the speed of the first 10 steps")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=50)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--init", choices=["copy", "random"], default="copy",
                   help="the decoder layer's start: a copy of the model's last full-attention layer, or HF's init")
    p.add_argument("--distill-weight", type=float, default=0.5,
                   help="weight of the KL from the frozen model's next-token distribution (0: cross entropy only)")
    p.add_argument("--chain-steps", type=int, default=3, help="drafts a window trains (1: the first only)")
    p.add_argument("--chain-decay", type=float, default=0.5, help="loss weight factor of each further draft")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=0, help="steps between validation scores (0: start and end)")
    p.add_argument("--eval-windows", type=int, default=32, help="validation windows of --seq-len scored")
    p.add_argument("--write-checkpoint", action="store_true",
                   help="merge mtp.* (bf16) into CHECKPOINT/model.safetensors, set mtp_num_hidden_layers: 1 in its "
                        "config.json and write the MTP section of its TRAINING.md")
    args = p.parse_args(argv)
    if not (args.out or args.merge):
        p.error("--out or --merge is required")
    return args


def step_losses(logits: list[torch.Tensor], ids: torch.Tensor, target_logits: torch.Tensor, t: int,
                distill: float) -> list[torch.Tensor]:
    """Per draft s: (1 - distill) x cross entropy against x_{i+s+1} + distill x KL(frozen model at i+s || MTP)."""
    losses = []
    for s, lg in enumerate(logits, start=1):
        lg = lg.float().flatten(0, 1)
        loss = F.cross_entropy(lg, ids[:, s + 1:s + 1 + t].flatten()) if distill < 1 else 0.0
        if distill > 0:
            teacher = F.log_softmax(target_logits[:, s:s + t].float().flatten(0, 1), dim=-1)
            kl = F.kl_div(F.log_softmax(lg, dim=-1), teacher, log_target=True, reduction="batchmean")
            loss = (1 - distill) * loss + distill * kl
        losses.append(loss)
    return losses


@torch.no_grad()
def evaluate(mtp: MTPLayer, base, windows: torch.Tensor, t: int, steps: int, batch_size: int) -> dict:
    """On validation windows [W, t + steps + 1]: draft 1's cross entropy and top-1 accuracy against
    x_{i+2}; each draft's top-1 agreement with the frozen model's greedy token (teacher forced)."""
    was = mtp.training
    mtp.eval()
    nll, correct, agree, count = 0.0, 0, [0] * steps, 0
    for i in range(0, windows.shape[0], batch_size):
        ids = windows[i:i + batch_size].to(next(mtp.parameters()).device)
        hidden, target_logits = target_pass(base, ids[:, :-1])
        logits = mtp_passes(mtp, base, ids, hidden, t, steps)
        first = logits[0].float().flatten(0, 1)
        labels = ids[:, 2:2 + t].flatten()
        nll += F.cross_entropy(first, labels, reduction="sum").item()
        correct += (first.argmax(-1) == labels).sum().item()
        for s, lg in enumerate(logits, start=1):
            agree[s - 1] += (lg.argmax(-1) == target_logits[:, s:s + t].argmax(-1)).sum().item()
        count += labels.numel()
    mtp.train(was)
    return {"loss": round(nll / count, 4), "top1": round(correct / count, 4),
            "agree_with_model": [round(a / count, 4) for a in agree], "tokens": count}


# ---- training ----------------------------------------------------------------------------------------

def learning_rate(step: int, args) -> float:
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    progress = min(1.0, (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps))
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def random_windows(ids: torch.Tensor, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, ids.numel() - length, (batch,), generator=generator)
    return ids[starts[:, None] + torch.arange(length)]


def validation_windows(stream, length: int, count: int) -> torch.Tensor:
    inputs, labels = consecutive_windows(stream, length - 1)
    return torch.cat([inputs, labels[:, -1:]], dim=1)[:count]


def train(args) -> dict:
    from transformers import AutoTokenizer, Qwen3_5ForCausalLM

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    tokenizer = AutoTokenizer.from_pretrained(args.checkpoint)
    text = text_stream(tokenizer, [d["text"] for d in load_documents(os.path.join(args.data, "train.jsonl"))])
    val = text_stream(tokenizer, [d["text"] for d in load_documents(os.path.join(args.data, "validation.jsonl"))])
    t, k = args.seq_len, args.chain_steps
    length = t + k + 1  # the frozen model reads t + k tokens; draft k of the last anchor predicts the last one
    val_windows = validation_windows(val, length, args.eval_windows)
    print(f"train {len(text)} tokens, validation {len(val)} ({val_windows.shape[0]} windows scored)", flush=True)

    base = Qwen3_5ForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32).to(device).eval()
    base.requires_grad_(False)
    mtp = build_mtp(base, args.init, args.seed).train()
    num_params = sum(p.numel() for p in mtp.parameters())
    decay = [p for p in mtp.parameters() if p.dim() >= 2]
    no_decay = [p for p in mtp.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    before = evaluate(mtp, base, val_windows, t, k, args.batch_size)
    print("before", json.dumps(before), flush=True)

    generator = torch.Generator().manual_seed(args.seed)
    weights = [args.chain_decay ** s for s in range(k)]
    calibrated = args.max_steps is None
    if calibrated:
        args.max_steps = 10 ** 9
    loss_curve, val_curve, step = [], [], 0
    start = time.perf_counter()
    while step < args.max_steps:
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, args)
        ids = random_windows(text.ids, args.batch_size, length, generator).to(device)
        hidden, target_logits = target_pass(base, ids[:, :-1])
        losses = step_losses(mtp_passes(mtp, base, ids, hidden, t, k), ids, target_logits, t, args.distill_weight)
        loss = sum(w * lo for w, lo in zip(weights, losses)) / sum(weights)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(mtp.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        elapsed = time.perf_counter() - start
        if calibrated and step == 10:
            args.max_steps = max(10, int(0.95 * args.time_budget_s / (elapsed / 10)))
            print(f"{elapsed / 10:.2f} s/step: {args.max_steps} steps for {args.time_budget_s} s", flush=True)
        if (step - 1) % args.log_every == 0 or step == args.max_steps:
            loss_curve.append({"step": step, "loss": round(loss.item(), 4),
                               "draft_losses": [round(float(lo.detach()), 4) for lo in losses],
                               "lr": round(optimizer.param_groups[0]["lr"], 6),
                               "grad_norm": round(grad_norm.item(), 3), "elapsed_s": round(elapsed, 1)})
            print(json.dumps(loss_curve[-1]), flush=True)
        if args.eval_every and step % args.eval_every == 0 and step < args.max_steps:
            val_curve.append({"step": step, **evaluate(mtp, base, val_windows, t, k, args.batch_size)})
            print(json.dumps(val_curve[-1]), flush=True)
    train_seconds = time.perf_counter() - start

    with torch.no_grad():  # score the bf16 values that ship
        for p in mtp.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    after = evaluate(mtp, base, val_windows, t, k, args.batch_size)
    print("after (bf16 weights)", json.dumps(after), flush=True)

    from safetensors.torch import save_file

    os.makedirs(args.out, exist_ok=True)
    save_file(mtp_tensors(mtp, torch.float32), os.path.join(args.out, "mtp.safetensors"), metadata={"format": "pt"})
    results = {
        "command": " ".join(["python", os.path.relpath(os.path.abspath(sys.argv[0]), ROOT), *sys.argv[1:]]),
        "args": vars(args),
        "device": (torch.cuda.get_device_name(device) if device.type == "cuda"
                   else f"cpu ({torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''})"),
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        "parameters": num_params,
        "steps": step,
        "train_seconds": round(train_seconds, 1),
        "entries_per_second": round(step * args.batch_size * t / train_seconds),
        "before": before,
        "after": after,
        "loss_curve": loss_curve,
        "val_curve": val_curve,
    }
    with open(os.path.join(args.out, "mtp_training.json"), "w") as f:
        json.dump(results, f, indent=2)
    if args.write_checkpoint:
        write_checkpoint(args.checkpoint, mtp_tensors(mtp, torch.bfloat16), results)
    return results


# ---- the checkpoint ----------------------------------------------------------------------------------

def write_checkpoint(path: str, tensors: dict[str, torch.Tensor], results: dict) -> None:
    """Replace the checkpoint's mtp.* tensors by `tensors`, set mtp_num_hidden_layers: 1 in config.json and
    write (or replace) the MTP section of TRAINING.md."""
    from safetensors.torch import load_file, save_file

    file = os.path.join(path, "model.safetensors")
    mode = os.stat(file).st_mode
    model = {k: v for k, v in load_file(file).items() if not k.startswith("mtp.")}
    save_file({**model, **tensors}, file, metadata={"format": "pt"})
    os.chmod(file, mode)
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["mtp_num_hidden_layers"] = 1
    with open(os.path.join(path, "config.json"), "w") as f:
        f.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    record = os.path.join(path, "TRAINING.md")
    with open(record) as f:
        text = f.read()
    text = re.split(rf"\n{re.escape(SECTION)}\n", text)[0].rstrip("\n") + "\n\n" + training_section(results)
    with open(record, "w") as f:
        f.write(text)
    print(f"wrote {len(tensors)} mtp.* tensors into {file}, mtp_num_hidden_layers: 1, {record}", flush=True)


def training_section(r: dict) -> str:
    a, before, after = r["args"], r["before"], r["after"]
    init = "a copy of the model's last full-attention layer" if a["init"] == "copy" else "HF's init"
    loss = "cross entropy against x_(i+2)"
    if a["distill_weight"]:
        loss += f" mixed with {a['distill_weight']} x the KL from the model's own next-token distribution at i + 1"
    if a["chain_steps"] > 1:
        loss += (f", over {a['chain_steps']} chained drafts (the runtime's chain, teacher forced; "
                 f"weights {a['chain_decay']}^(s-1))")

    def pct(values):
        return ", ".join(f"{x:.1%}" for x in values)

    lines = [
        SECTION, "",
        f"`mtp.*` ({r['parameters'] / 1e6:.2f} M parameters, bf16; `mtp_num_hidden_layers: 1`): the draft layer of "
        f"`--speculative-algorithm NEXTN`, trained by `tools/default_model/train_mtp.py` with the model above frozen, "
        f"on {r['device']} in {r['train_seconds']:.0f} s: {r['steps']} steps of {a['batch_size']} x {a['seq_len']} "
        "entries.",
        "",
        "    " + r["command"], "",
        f"Seed {a['seed']}; the decoder layer starts as {init}; AdamW (0.9, 0.95), lr {a['lr']} with "
        f"{a['warmup_steps']} warmup steps then cosine to {a['min_lr_ratio']} x; weight decay {a['weight_decay']}; "
        f"grad clip 1.0; loss: {loss}. torch {r['versions']['torch']}, "
        f"transformers {r['versions']['transformers']}.",
        "",
        f"Validation ({after['tokens']} entries, consecutive windows of {a['seq_len']}); the last column: top-1 "
        "agreement with the model's own greedy token, for each chained draft (teacher forced):",
        "",
        "| | loss vs x_(i+2) (nats) | top-1 accuracy vs x_(i+2) | agreement with the model |",
        "|---|---|---|---|",
        f"| before training | {before['loss']:.4f} | {before['top1']:.1%} | {pct(before['agree_with_model'])} |",
        f"| after (bf16 weights as saved) | {after['loss']:.4f} | {after['top1']:.1%} | "
        f"{pct(after['agree_with_model'])} |",
        "",
    ]
    if r.get("accept"):
        lines += [r["accept"], ""]
    return "\n".join(lines)


def merge(args) -> None:
    from safetensors.torch import load_file

    with open(os.path.join(args.merge, "mtp_training.json")) as f:
        results = json.load(f)
    if args.accept_json:
        with open(args.accept_json) as f:
            a = json.load(f)
        results["accept"] = (
            f"Accept length with hybrid_sgl's Engine (`tools/default_model/mtp_accept.py`: {a['prompts']} held-out "
            f"prompts of {a['prompt_tokens']} tokens, {a['new_tokens']} greedy tokens each, NEXTN with 3 chained "
            f"drafts, {a['dtype']} on {a['device']}): **{a['accept_length']:.2f}** tokens per verify step "
            f"({a['verify_rows']} verify rows; completion tokens / spec_verify_ct {a['tokens_per_verify_ct']:.2f}); "
            f"greedy output identical to plain decoding in {a['identical_prompts']}/{a['prompts']} prompts.")
    tensors = {k: v.to(torch.bfloat16) for k, v in load_file(os.path.join(args.merge, "mtp.safetensors")).items()}
    write_checkpoint(args.checkpoint, tensors, results)


def main() -> None:
    args = parse_args()
    if args.merge:
        merge(args)
        return
    results = train(args)
    print(json.dumps({k: results[k] for k in ("steps", "train_seconds", "entries_per_second", "before", "after")},
                     indent=2))


if __name__ == "__main__":
    main()
