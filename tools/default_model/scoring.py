"""Validation perplexity of the model, the perplexity of a unigram model on the same target tokens
(the baseline), and text samples."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from token_data import TokenStream, consecutive_windows

TEXT_PROMPTS = ["ROMEO:\n", "HAMLET:\nTo be, or not to be", "In the beginning", "The king said", "Once upon a time"]
CHAT_PROMPTS = ["Good morrow, sir. How dost thou?", "Continue this passage:\nNow is the winter of our discontent"]


def autocast(device: torch.device):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


@torch.no_grad()
def validation_nll(model, stream: TokenStream, seq_len: int, batch_size: int, max_windows: int | None = None) -> float:
    """Mean next-token NLL (nats) over consecutive windows of the validation stream."""
    inputs, labels = consecutive_windows(stream, seq_len)
    if max_windows is not None:
        inputs, labels = inputs[:max_windows], labels[:max_windows]
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, inputs.shape[0], batch_size):
        x, y = inputs[i:i + batch_size].to(device), labels[i:i + batch_size].to(device)
        with autocast(device):
            logits = model(input_ids=x, use_cache=False).logits
        total += F.cross_entropy(logits.float().flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
    model.train(was_training)
    return total / count


def unigram_nll(train: TokenStream, validation: TokenStream, seq_len: int, vocab_size: int,
                max_windows: int | None = None) -> float:
    """Mean NLL of the validation targets (the same tokens validation_nll scores) under add-one smoothed
    unigram frequencies of the training stream."""
    counts = torch.bincount(train.ids, minlength=vocab_size).double() + 1.0
    log_probs = (counts / counts.sum()).log()
    _, labels = consecutive_windows(validation, seq_len)
    return -log_probs[labels[:max_windows].flatten()].mean().item()


def perplexity(nll: float) -> float:
    return math.exp(nll)


@torch.no_grad()
def samples(model, tokenizer, seed: int, max_new_tokens: int = 64) -> list[dict]:
    """Greedy and sampled (temperature 0.8, top-k 40) continuations of TEXT_PROMPTS, and greedy replies
    to CHAT_PROMPTS through the chat template."""
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    eos = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    out = []

    def generate(prompt_ids: list[int], **kwargs) -> str:
        ids = torch.tensor([prompt_ids], device=device)
        with autocast(device):
            gen = model.generate(ids, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos[1], **kwargs)
        return tokenizer.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)

    for prompt in TEXT_PROMPTS:
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        torch.manual_seed(seed)
        out.append({"kind": "text", "prompt": prompt, "greedy": generate(ids, do_sample=False),
                    "sampled": generate(ids, do_sample=True, temperature=0.8, top_k=40)})
    for prompt in CHAT_PROMPTS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True, return_dict=False)
        out.append({"kind": "chat", "prompt": prompt, "greedy": generate(list(ids), do_sample=False)})
    model.train(was_training)
    return out
