"""What a step gives back for each of its batch items (ItemResult), and how the runner reads it from the
step's logits: which rows of the packed batch need logits at all (the sampled rows and the prompt positions
whose logprobs were asked for), then the sampled token and the logprobs of each item."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from hybrid_sgl.runner.sampler import ids_logprobs, logprobs_of

if TYPE_CHECKING:
    from hybrid_sgl.runner.model_runner import BatchItem
    from hybrid_sgl.scheduler.request import Req


@dataclass
class ItemResult:
    next_token: int | None = None
    token_logprob: float | None = None
    top_logprobs: list = field(default_factory=list)
    # prompt positions whose logprob was computed this step: (position, logprob, top pairs)
    input_logprobs: list[tuple[int, float, list]] = field(default_factory=list)
    # token_ids_logprob: (logprob, id) of each chosen id, at the sampled position and at those prompt positions
    token_ids_logprobs: list[tuple[float, int]] | None = None
    input_token_ids_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)


def logit_rows(items: list[BatchItem]) -> tuple[list[int], list[tuple[int, int]], list[tuple[int, int, int]]]:
    """Rows of the packed batch that need logits (rows), and what each is for. sample_rows: (item, logits
    row); lp_rows: (item, logits row, prompt position p whose logits score token p + 1)."""
    rows, sample_rows, lp_rows, offset = [], [], [], 0
    for i, it in enumerate(items):
        req = it.req
        if req.wants_input_logprobs():
            lo = req.input_logprob_pos - 1
            for p in range(max(it.start, lo), min(it.end, len(req.prompt_ids) - 1)):
                lp_rows.append((i, len(rows), p))
                rows.append(offset + p - it.start)
        if it.sample:
            last = offset + it.end - it.start - 1
            if rows and rows[-1] == last:
                sample_rows.append((i, len(rows) - 1))
            else:
                sample_rows.append((i, len(rows)))
                rows.append(last)
        offset += it.end - it.start
    return rows, sample_rows, lp_rows


def sampled_into(results: list[ItemResult], chosen: torch.Tensor, next_ids: torch.Tensor, reqs: list[Req],
                 sample_rows: list[tuple[int, int]], mask: torch.Tensor | None) -> None:
    """The sampled tokens next_ids [S] and, where asked, their logprobs from chosen [S, V] (the sampled rows'
    logits, under the grammar mask) into results[item] of each sample row (item, logits row)."""
    want = [r.return_logprob for r in reqs]
    top_k = max([r.top_logprobs_num for r in reqs if r.return_logprob], default=0)
    lps, tops = logprobs_of(chosen, next_ids, top_k, mask) if any(want) else (None, None)
    for j, ((i, _), token) in enumerate(zip(sample_rows, next_ids.tolist())):
        results[i].next_token = token
        if want[j]:
            results[i].token_logprob = lps[j]
            results[i].top_logprobs = tops[j][: reqs[j].top_logprobs_num]
    if any(r.return_logprob and r.token_ids_logprob for r in reqs):
        chosen_lps = ids_logprobs(chosen, [r.token_ids_logprob if r.return_logprob else None for r in reqs], mask)
        for j, (i, _) in enumerate(sample_rows):
            if want[j] and reqs[j].token_ids_logprob:
                results[i].token_ids_logprobs = chosen_lps[j]


def input_logprobs_into(results: list[ItemResult], logits: torch.Tensor, items: list[BatchItem],
                        lp_rows: list[tuple[int, int, int]]) -> None:
    """The prompt logprobs of each lp row (item, logits row, position p: its logits score token p + 1) from
    logits [R, V] into results[item]."""
    rows = logits[torch.tensor([r for _, r, _ in lp_rows], device=logits.device)]
    targets = torch.tensor([items[i].req.prompt_ids[p + 1] for i, _, p in lp_rows], device=logits.device)
    top_k = max(items[i].req.top_logprobs_num for i, _, _ in lp_rows)
    lps, tops = logprobs_of(rows, targets, top_k)
    for (i, _, p), lp, top in zip(lp_rows, lps, tops):
        results[i].input_logprobs.append((p + 1, lp, top[: items[i].req.top_logprobs_num]))
    ids = [items[i].req.token_ids_logprob for i, _, _ in lp_rows]
    if any(ids):
        for (i, _, _), chosen_lps in zip(lp_rows, ids_logprobs(rows, ids)):
            results[i].input_token_ids_logprobs.append(chosen_lps)
