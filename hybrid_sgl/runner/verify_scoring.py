"""What a verify step's positions score (runner/speculative.py): each draft row's logits as plain decoding would
see them after the drafts before each position, the tokens a row keeps, and their logprobs.

- A grammar: its mask after the drafts before the position. fit_grammars walks each constrained row's matcher
  through its drafts first, cutting them before the first one the grammar rejects or that would end it, and
  rolls the matcher back; the tokens kept advance it when they are applied.
- Logit bias, penalties and min_new_tokens: over the output as if those drafts were kept (AfterDrafts).
- Greedy rows keep their drafts while they equal the model's own token, then that token; sampled rows use
  speculative sampling (speculative_sample), which keeps each token's distribution.
- Logprobs: the raw distribution under the grammar's mask, as a decode step reports them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from hybrid_sgl.batch import device_index
from hybrid_sgl.constrained.bitmask import mask_words
from hybrid_sgl.runner.sampler import adjust_logits, apply_token_bitmask, filtered_probs, ids_logprobs, logprobs_of
from hybrid_sgl.sampling_params import SamplingParams

if TYPE_CHECKING:
    from hybrid_sgl.runner.model_runner import BatchItem
    from hybrid_sgl.runner.step_results import ItemResult
    from hybrid_sgl.scheduler.request import Req


@dataclass
class AfterDrafts:
    """What the logit adjustments (sampler.adjust_logits) read of a request, as it would stand after its
    first drafts were kept: the distribution at a verify position is the one plain decoding would see there."""

    params: SamplingParams
    output_ids: list[int]
    prompt_ids: list[int]

    @property
    def fill_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids


def speculative_sample_rows(probs: torch.Tensor, drafts: torch.Tensor,
                            generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling of B verify rows at once, on the device: probs [B, k + 1, V], each row's model
    (filtered) distribution after its token and each draft; drafts [B, k] int64. Draft i of a row is kept with
    probability probs[i, d_i] while all before it were; the first one rejected is replaced by a draw from
    probs[i] without d_i (renormalized); a row that keeps all k draws one more from probs[k].
    Returns (the drafts each row keeps [B], the token after them [B])."""
    B, k1, V = probs.shape
    k = k1 - 1
    keep_p = probs[:, :k].gather(2, drafts[:, :, None])[:, :, 0]  # [B, k]
    uniform = torch.rand(B, k, device=probs.device, generator=generator)
    acc = (uniform < keep_p).long().cumprod(dim=1).sum(dim=1)
    at = probs.gather(1, acc[:, None, None].expand(B, 1, V))[:, 0]  # [B, V]: the distribution at position acc
    rejected = drafts.gather(1, acc.clamp(max=k - 1)[:, None])  # [B, 1] (unused where acc == k)
    residual = torch.where((acc < k)[:, None], at.scatter(1, rejected, 0.0), at)
    residual = residual / residual.sum(-1, keepdim=True).clamp_min(1e-30)
    noise = torch.empty_like(residual).exponential_(generator=generator)
    return acc, (residual / noise).argmax(dim=-1)


def speculative_sample(probs: torch.Tensor, draft: list[int], generator: torch.Generator | None) -> list[int]:
    """The tokens one sampled verify row gains (speculative_sample_rows of one row): probs [k + 1, V]; draft [k]."""
    acc, last = speculative_sample_rows(probs[None], torch.tensor([draft], device=probs.device), generator)
    j, token = torch.stack([acc[0], last[0]]).tolist()
    return draft[:j] + [token]


def scored_logits(logits: torch.Tensor, items: list[BatchItem], drafts: list[list[int]],
                  draft_rows: list[tuple[int, int]], masks: dict[int, torch.Tensor],
                  eos_ids: tuple[int, ...]) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
    """logits [R, V] of a verify step; draft_rows: (item index, its first logit row) of the rows with drafts;
    masks: fit_grammars' host masks. Returns the logits with each draft row's positions under its grammar's
    mask and logit adjustments (a copy where any applies), and the masks on the device."""
    scored = logits
    if masks:  # one copy of the masks to the device
        at = [f + j for i, f in draft_rows if i in masks for j in range(len(drafts[i]) + 1)]
        index = device_index(at, logits.device)
        on_device = torch.cat(list(masks.values())).to(logits.device)
        scored = logits.index_copy(0, index, apply_token_bitmask(logits[index], on_device))
        starts = itertools.accumulate((len(m) for m in masks.values()), initial=0)
        masks = {i: on_device[s:s + len(m)] for (i, m), s in zip(masks.items(), starts)}
    at = [(i, f + j, j) for i, f in draft_rows if items[i].req.params.adjusts_logits for j in range(len(drafts[i]) + 1)]
    if at:
        index = device_index([row for _, row, _ in at], logits.device)
        views = [AfterDrafts(items[i].req.params, items[i].req.output_ids + drafts[i][:j], items[i].req.prompt_ids)
                 for i, _, j in at]
        scored = scored.index_copy(0, index, adjust_logits(scored[index], views, eos_ids))
    return scored, masks


def accepted_tokens(scored: torch.Tensor, items: list[BatchItem], drafts: list[list[int]],
                    draft_rows: list[tuple[int, int]]) -> dict[int, list[int]]:
    """{item index: the tokens its row keeps} for the rows with drafts: scored [R, V] from scored_logits."""
    kept = {}
    greedy_rows = [(i, f) for i, f in draft_rows if items[i].req.params.greedy]
    if greedy_rows:
        greedy = scored.argmax(dim=-1).tolist()  # every logit row: one read of the step's tokens
        for i, f in greedy_rows:
            d = drafts[i]
            own = greedy[f:f + len(d) + 1]
            j = 0
            while j < len(d) and d[j] == own[j]:
                j += 1
            kept[i] = d[:j] + [own[j]]
    for i, f in draft_rows:
        req = items[i].req
        if not req.params.greedy:
            n = len(drafts[i]) + 1
            kept[i] = speculative_sample(filtered_probs(scored[f:f + n], [req] * n), drafts[i], req.generator)
    return kept


def fit_grammars(items: list[BatchItem], drafts: list[list[int]], vocab: int) -> dict[int, torch.Tensor]:
    """Cut each constrained row's drafts (in place) before the first one its grammar rejects or that would
    end the grammar, and fill its masks. Returns {item index: [kept drafts + 1, words] int32 host bitmask of
    the row's verify positions}, for rows that keep a draft; every matcher is left where it was."""
    masks = {}
    for i, (it, draft) in enumerate(zip(items, drafts)):
        matcher = it.req.grammar
        if not draft or matcher is None:
            continue
        rows = torch.full((len(draft) + 1, mask_words(vocab)), -1, dtype=torch.int32)
        matcher.fill_mask(rows, 0)
        n = 0
        while n < len(draft) and matcher.accept(draft[n]):
            if matcher.is_terminated():  # the draft would end the grammar: verified as the model's own token
                matcher.rollback(1)
                break
            n += 1
            matcher.fill_mask(rows, n)
        if n:
            matcher.rollback(n)
            masks[i] = rows[:n + 1]
        drafts[i] = draft[:n]
    return masks


def add_logprobs(logits: torch.Tensor, rows: list[tuple[int, Req, list[ItemResult], torch.Tensor | None]]) -> None:
    """Fill the logprobs of verify rows' kept tokens, all rows at once, as a decode step computes them (the raw
    distribution, under the grammar's mask): each token's, its top ones and those of token_ids_logprob.
    rows: (the row's first logit row, its request, the results of its kept tokens, its masks [>= kept, words]
    or None)."""
    if not rows:
        return
    dev = logits.device
    index = device_index([f + j for f, _, results, _ in rows for j in range(len(results))], dev)
    tokens = device_index([res.next_token for _, _, results, _ in rows for res in results], dev)
    mask = None
    if any(m is not None for *_, m in rows):
        words = next(m for *_, m in rows if m is not None).shape[1]
        mask = torch.cat([m[:len(results)] if m is not None else torch.full((len(results), words), -1,
                          dtype=torch.int32, device=dev) for _, _, results, m in rows])
    chosen = logits[index]
    lps, tops = logprobs_of(chosen, tokens, max(req.top_logprobs_num for _, req, _, _ in rows), mask)
    ids = ids_logprobs(chosen, [req.token_ids_logprob for _, req, results, _ in rows for _ in results], mask)
    at = 0
    for _, req, results, _ in rows:
        for res in results:
            res.token_logprob, res.top_logprobs = lps[at], tops[at][:req.top_logprobs_num]
            if req.token_ids_logprob:
                res.token_ids_logprobs = ids[at]
            at += 1
