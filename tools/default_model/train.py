"""Train the bundled default model: HF transformers' Qwen3_5ForCausalLM (model_config.py) from scratch on
the prepared corpus (prepare_data.py) with the committed tokenizer (train_tokenizer.py), then save a
bf16 HF checkpoint with TRAINING.md / training.json (loss curve, perplexities, samples, provenance).

    python tools/default_model/train.py --out OUT [--time-budget-s 240 | --max-steps N] [--device cuda|cpu]

Plain PyTorch: AdamW, linear warmup then cosine decay, bf16 autocast on CUDA, random windows of
--seq-len tokens drawn with a seeded generator. During the last --chat-fraction of the steps half of
each batch is ChatML pairs (chat_pairs.py) with the loss on the assistant turns only."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.modules.setdefault("fla", None)  # HF's torch GDN path everywhere: the run does not depend on fla-core

import report  # noqa: E402
import scoring  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from chat_pairs import chat_stream  # noqa: E402
from model_config import build_model  # noqa: E402
from token_data import IGNORE, load_documents, random_windows, text_stream  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="checkpoint directory to write")
    p.add_argument("--data", default=os.path.join(".data", "default_model"), help="prepare_data.py's output")
    p.add_argument("--tokenizer", default=os.path.join(HERE, "tokenizer"))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-steps", type=int, default=None,
                   help="steps to train; default: as many as --time-budget-s allows (the report records the number, "
                        "so a rerun with --max-steps repeats the run)")
    p.add_argument("--time-budget-s", type=float, default=240.0,
                   help="without --max-steps: the step count is set from the speed of the first --calibration-steps")
    p.add_argument("--calibration-steps", type=int, default=25)
    p.add_argument("--max-epochs", type=float, default=4.0,
                   help="upper bound on the steps the budget gives: 2.5 M training tokens do not bear more "
                        "(validation loss rose from epoch 5 on in a 16-epoch run)")
    p.add_argument("--time-limit-s", type=float, default=420.0,
                   help="stop early (and say so in the report) if training runs longer than this")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--chat-fraction", type=float, default=0.2)
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-windows", type=int, default=64, help="validation windows scored during training")
    p.add_argument("--final-eval-windows", type=int, default=None,
                   help="validation windows scored at the end (default: all; fewer only for smoke runs)")
    p.add_argument("--eval-batch-size", type=int, default=32)
    return p.parse_args(argv)


def learning_rate(step: int, args) -> float:
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    progress = (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps)
    return args.lr * (args.min_lr_ratio + (1 - args.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def make_optimizer(model, args, device: torch.device):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")


def steps_for_budget(args, step_seconds: float, elapsed: float, train_tokens: int) -> tuple[int, str]:
    """(steps, which bound set them): the time budget or --max-epochs, whichever comes first."""
    by_time = args.calibration_steps + int(0.97 * (args.time_budget_s - elapsed) / step_seconds)
    by_epochs = int(args.max_epochs * train_tokens / (args.batch_size * args.seq_len))
    if by_epochs < by_time:
        return max(args.calibration_steps, by_epochs), f"--max-epochs {args.max_epochs} (before the time budget)"
    return max(args.calibration_steps, by_time), f"a time budget of {args.time_budget_s} s"


def next_batch(step: int, args, text, chat, generator: torch.Generator):
    chat_start = args.max_steps - int(args.chat_fraction * args.max_steps)
    if step < chat_start or args.chat_fraction <= 0:
        return random_windows(text, args.batch_size, args.seq_len, generator)
    half = args.batch_size // 2
    x1, y1 = random_windows(text, args.batch_size - half, args.seq_len, generator)
    x2, y2 = random_windows(chat, half, args.seq_len, generator)
    return torch.cat([x1, x2]), torch.cat([y1, y2])


def train_step(model, optimizer, lr: float, x: torch.Tensor, y: torch.Tensor):
    for group in optimizer.param_groups:
        group["lr"] = lr
    with scoring.autocast(x.device):
        logits = model(input_ids=x, use_cache=False).logits
    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), ignore_index=IGNORE)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach(), grad_norm


def seconds_since(start: float, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def train(args) -> dict:
    from transformers import AutoTokenizer

    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = True
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    train_docs = load_documents(os.path.join(args.data, "train.jsonl"))
    val_docs = load_documents(os.path.join(args.data, "validation.jsonl"))
    text = text_stream(tokenizer, [d["text"] for d in train_docs])
    val = text_stream(tokenizer, [d["text"] for d in val_docs])
    chat, num_pairs = chat_stream(tokenizer, train_docs, args.seed)
    print(f"train {len(text)} tokens, validation {len(val)}, chat {len(chat)} ({num_pairs} pairs)", flush=True)

    model = build_model(tokenizer, args.seed).to(device).train()
    num_params = sum(p.numel() for p in model.parameters())
    optimizer = make_optimizer(model, args, device)
    generator = torch.Generator().manual_seed(args.seed)
    loss_curve, val_curve = [], []
    start = time.perf_counter()
    calibrated = args.max_steps is None
    steps_from = "--max-steps"
    if calibrated:
        assert args.calibration_steps <= args.warmup_steps, "calibration steps must fall within the warmup"
        args.max_steps = 10 ** 9  # set after the calibration steps
    step, mark5, stopped_early = 0, 0.0, False
    while step < args.max_steps:
        x, y = next_batch(step, args, text, chat, generator)
        loss, grad_norm = train_step(model, optimizer, learning_rate(step, args), x.to(device), y.to(device))
        step += 1
        if calibrated and step in (5, args.calibration_steps):
            mark = seconds_since(start, device)
            if step == 5:
                mark5 = mark
            else:
                step_seconds = (mark - mark5) / (args.calibration_steps - 5)
                args.max_steps, steps_from = steps_for_budget(args, step_seconds, mark, len(text))
                print(f"{step_seconds * 1e3:.1f} ms/step: {args.max_steps} steps, set by {steps_from}", flush=True)
        elapsed = time.perf_counter() - start
        if (step - 1) % args.log_every == 0 or step == args.max_steps:
            loss_curve.append({"step": step, "loss": round(loss.item(), 4), "lr": optimizer.param_groups[0]["lr"],
                               "grad_norm": round(grad_norm.item(), 3), "elapsed_s": round(elapsed, 1)})
            print(json.dumps(loss_curve[-1]), flush=True)
        if step % args.eval_every == 0:
            nll = scoring.validation_nll(model, val, args.seq_len, args.eval_batch_size, args.eval_windows)
            val_curve.append({"step": step, "val_loss": round(nll, 4), "elapsed_s": round(elapsed, 1)})
            print(json.dumps(val_curve[-1]), flush=True)
        if elapsed > args.time_limit_s:
            stopped_early = True
            print(f"time limit {args.time_limit_s} s reached after {step} steps", flush=True)
            break
    steps_done = step
    train_seconds = time.perf_counter() - start

    model.to(torch.bfloat16)
    os.makedirs(args.out, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    eos = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": eos, "pad_token_id": eos[1], "do_sample": False}, f, indent=2)
    model.float()  # the saved bf16 values, evaluated with the same autocast as in training
    val_nll = scoring.validation_nll(model, val, args.seq_len, args.eval_batch_size, args.final_eval_windows)
    scored_tokens = min((len(val) - 1) // args.seq_len, args.final_eval_windows or len(val)) * args.seq_len
    unigram = scoring.unigram_nll(text, val, args.seq_len, len(tokenizer), args.final_eval_windows)
    results = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "args": vars(args),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
        "parameters": num_params,
        "tokens": {"train": len(text), "validation": len(val), "chat": len(chat), "chat_pairs": num_pairs},
        "steps": steps_done,
        "steps_from": steps_from,
        "stopped_early": stopped_early,
        "train_seconds": round(train_seconds, 1),
        "tokens_per_second": round(steps_done * args.batch_size * args.seq_len / train_seconds),
        "epochs": round(steps_done * args.batch_size * args.seq_len / len(text), 2),
        "validation": {"scored_tokens": scored_tokens,
                       "loss": round(val_nll, 4), "perplexity": round(scoring.perplexity(val_nll), 2),
                       "unigram_loss": round(unigram, 4), "unigram_perplexity": round(scoring.perplexity(unigram), 2)},
        "loss_curve": loss_curve,
        "val_curve": val_curve,
        "samples": scoring.samples(model, tokenizer, args.seed),
        "corpus": report.corpus_provenance(args.data),
    }
    report.write(args.out, results)
    return results


def main() -> None:
    results = train(parse_args())
    print(json.dumps({k: results[k] for k in ("steps", "train_seconds", "tokens_per_second", "epochs", "validation")},
                     indent=2))


if __name__ == "__main__":
    main()
