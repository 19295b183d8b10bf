"""Next-token sampling and logprobs for a batch of rows (one row per request being sampled).

Order: grammar mask (when given) -> logit bias -> penalties -> min_new_tokens mask -> greedy rows take argmax; the rest:
temperature -> softmax -> top-k -> top-p -> min-p -> draw. Draws use the exponential race
(argmax p / E, E ~ Exp(1)), which samples from p and lets each seeded request use its own
generator. Logprobs are always of the model's raw distribution (log_softmax of the logits).
"""

from __future__ import annotations

import torch

from hybrid_sgl.scheduler.request import Req


def sample(logits: torch.Tensor, reqs: list[Req], eos_ids: tuple[int, ...],
           mask: torch.Tensor | None = None) -> torch.Tensor:
    """logits: [N, V] float32 (not modified); mask: [N, ceil(V / 32)] int32 token bitmask on logits'
    device (constrained/bitmask.py), or None. Returns next token ids [N] int64 on logits' device."""
    if mask is not None:
        logits = apply_token_bitmask(logits, mask)
    logits = _adjust(logits, reqs, eos_ids)
    out = logits.argmax(dim=-1)
    sampled = [i for i, r in enumerate(reqs) if not r.params.greedy]
    if not sampled:
        return out
    rows = torch.tensor(sampled, device=logits.device)
    sub = [reqs[i] for i in sampled]
    probs = _filtered_probs(logits[rows], sub)
    noise = torch.empty_like(probs)
    unseeded = [j for j, r in enumerate(sub) if r.generator is None]
    if unseeded:
        noise[unseeded] = torch.empty_like(probs[unseeded]).exponential_()
    for j, r in enumerate(sub):
        if r.generator is not None:
            noise[j].exponential_(generator=r.generator)
    out[rows] = (probs / noise).argmax(dim=-1)
    return out


def apply_token_bitmask(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """A copy of logits [N, V] with -inf where bit (t % 32) of mask[:, t // 32] is clear."""
    n, vocab = logits.shape
    assert mask.shape == (n, (vocab + 31) // 32), f"mask {tuple(mask.shape)} does not fit logits {(n, vocab)}"
    bits = torch.arange(32, device=mask.device, dtype=torch.int32)
    allowed = ((mask[:, :, None] >> bits) & 1).bool().view(n, -1)[:, :vocab]  # [N, V]
    return logits.masked_fill(~allowed, float("-inf"))


def _adjust(logits: torch.Tensor, reqs: list[Req], eos_ids: tuple[int, ...]) -> torch.Tensor:
    """Logit bias, penalties and the min_new_tokens stop mask; copies only when something applies."""
    copied = False
    for i, r in enumerate(reqs):
        p = r.params
        touch = p.logit_bias or p.uses_penalties or len(r.output_ids) < p.min_new_tokens
        if not touch:
            continue
        if not copied:
            logits, copied = logits.clone(), True
        row = logits[i]
        if p.logit_bias:
            ids = torch.tensor(list(p.logit_bias), device=row.device)
            row[ids] += torch.tensor(list(p.logit_bias.values()), device=row.device)
        if p.uses_penalties:
            _penalize(row, r)
        if len(r.output_ids) < p.min_new_tokens:
            stops = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_ids))
            if stops:
                row[torch.tensor(stops, device=row.device)] = float("-inf")
    return logits


def _penalize(row: torch.Tensor, r: Req) -> None:
    p = r.params
    if r.output_ids and (p.frequency_penalty or p.presence_penalty):
        counts = torch.bincount(torch.tensor(r.output_ids, device=row.device), minlength=row.shape[0]).float()
        row -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).float()
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(r.fill_ids)), device=row.device)
        vals = row[seen]
        row[seen] = torch.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)


def _filtered_probs(logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
    """[n, V] probabilities after temperature, top-k, top-p and min-p (renormalized)."""
    dev = logits.device
    temp = torch.tensor([r.params.temperature for r in reqs], device=dev)[:, None]
    probs = (logits / temp).softmax(dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    vocab = probs.shape[-1]
    top_k = torch.tensor([min(r.params.top_k, vocab) if r.params.top_k > 0 else vocab for r in reqs], device=dev)
    rank = torch.arange(vocab, device=dev)[None, :]
    sorted_p = sorted_p.masked_fill(rank >= top_k[:, None], 0.0)
    top_p = torch.tensor([r.params.top_p for r in reqs], device=dev)[:, None]
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly before each token
    sorted_p = sorted_p.masked_fill(before > top_p * sorted_p.sum(-1, keepdim=True), 0.0)
    min_p = torch.tensor([r.params.min_p for r in reqs], device=dev)[:, None]
    sorted_p = sorted_p.masked_fill(sorted_p < min_p * sorted_p[:, :1], 0.0)
    return torch.zeros_like(probs).scatter_(1, order, sorted_p / sorted_p.sum(-1, keepdim=True))


def ids_logprobs(logits: torch.Tensor, id_lists: list[list[int] | None]) -> list[list[tuple[float, int]]]:
    """logits: [N, V]; id_lists[i]: token ids for row i, or None. (logprob, id) of each id in its row."""
    rows = [i for i, ids in enumerate(id_lists) if ids]
    out: list[list[tuple[float, int]]] = [[] for _ in id_lists]
    if rows:
        logp = logits[torch.tensor(rows, device=logits.device)].float().log_softmax(dim=-1)
        for k, i in enumerate(rows):
            out[i] = list(zip(logp[k, id_lists[i]].tolist(), id_lists[i]))
    return out


def logprobs_of(logits: torch.Tensor, ids: torch.Tensor, top_k: int) -> tuple[list[float], list[list]]:
    """logits: [N, V]; ids: [N]. Returns the logprob of ids[i] in row i, and (when top_k > 0) the
    top_k (logprob, token id) pairs of each row."""
    logp = logits.float().log_softmax(dim=-1)
    chosen = logp.gather(1, ids.view(-1, 1)).flatten().tolist()
    if top_k <= 0:
        return chosen, [[] for _ in chosen]
    vals, idx = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
    tops = [list(zip(v, i)) for v, i in zip(vals.tolist(), idx.tolist())]
    return chosen, tops
