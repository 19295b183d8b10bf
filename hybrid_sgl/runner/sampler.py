"""Next-token sampling and logprobs for a batch of rows (one row per request being sampled).

Order: grammar mask (when given) -> logit bias -> penalties -> min_new_tokens mask -> greedy rows take argmax; the rest:
temperature -> softmax -> top-k -> top-p -> min-p -> draw. Draws use the exponential race
(argmax p / E, E ~ Exp(1)), which samples from p and lets each seeded request use its own
generator. Logprobs are of the model's distribution (log_softmax of the logits), restricted to the tokens
the grammar allows where a row has a grammar mask: the allowed tokens' probabilities sum to 1 and a
forbidden token has none (it never appears among the top logprobs). Bias, penalties and temperature do
not change them.

`sample_ref` is the plain definition: it sorts the whole vocabulary. `sample` keeps the same
support without that sort. Top-k and top-p keep a prefix of the tokens ordered by probability (ties
by lower token id, as a stable sort), so the kept set is "every token above a boundary value, and
the first `need` tokens equal to it"; `sample` finds that boundary among the `torch.topk` candidates
(k = the largest top_k, or CANDIDATES when a row asks for top_p without top_k) and sorts the full
vocabulary only for a top_p row whose kept mass reaches past its candidates (finding those rows is the
one read back to the host, only in a batch with a top_p row without top_k). Min-p is a threshold
on the probability itself and needs no order. Both draw the same Exp(1) noise from the same
generators in the same order, so a seed gives the same tokens through either function (up to a
float near-tie between two tokens' p / E, or a token whose preceding mass is within rounding of
top_p times the total, where the two sum in a different order).

On CUDA (`kernels=True`) the top_k boundary is found in logit space (the order of the logits is that of
the probabilities; ties are exact in both) and Triton kernels (triton_kernels/sampling.py, top_p.py) take the row
statistics and the draw, each in one read of the row, instead of materializing the probabilities and the
[n, V] masks. A top_p row without top_k takes no candidates there: its race runs over every token, and the
winner over the kept tokens is the first of the race's best-scoring tokens that top-p keeps (one more read of
the row tells which are kept; the same token as the boundary's draw). Where none of them is kept, the boundary
comes from a radix search on the device and the row draws again. Nothing is read back to the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybrid_sgl.scheduler.request import Req
from triton_kernels.sampling import GROUP, draw_kept, row_stats, top_logits
from triton_kernels.top_p import top_p_bound, top_p_race

CANDIDATES = 1024  # the torch path: tokens searched for a top_p boundary before a row falls back to the full sort
# kernels: batches of at least this many sampled rows find the candidates through the row statistics' group
# maxima (triton_kernels/sampling.py: top_logits) instead of torch.topk over the vocabulary. The group maxima
# come with the statistics' read of the row, which pays for itself once many rows share it; for a few rows
# torch.topk is as fast
GROUP_CANDIDATES_MIN_ROWS = 32
# kernels: a top_p row without top_k keeps the first of its race's this many best-scoring tokens that top-p keeps
# (triton_kernels/top_p.py: top_p_race). Each is kept with probability about top_p, so it is rare that none is,
# and only then is the row searched (top_p_bound) and drawn again. A handful of race tokens keeps the common
# case to one pass over the row, with no candidate list to sort and nothing read back to the host
TOP_P_RACE_CANDIDATES = 8


@dataclass
class BatchParams:
    """One batch's sampling parameters as device tensors, built once while its requests stay the same.
    n = number of sampled (non-greedy) rows; tensors are over those rows."""

    reqs: list[Req]  # the batch these were built for (compared by identity)
    sampled: list[int]  # rows that sample, in batch order
    rows: torch.Tensor | None  # [n] int64 sampled rows, or None when every row samples
    temperature: torch.Tensor  # [n, 1] float32
    top_k: torch.Tensor  # [n, 1] int64; the vocabulary size where top_k is off
    top_p: torch.Tensor  # [n, 1] float32; +inf where top_p is off (1.0)
    min_p: torch.Tensor  # [n, 1] float32
    no_k_or_p: torch.Tensor  # [n, 1] bool: neither top_k nor top_p
    top_p_only: torch.Tensor  # [n] bool: top_p without top_k (its boundary may lie past the candidates)
    max_top_k: int  # largest top_k of a sampled row (0: none)
    any_top_p_only: bool
    any_top_p: bool
    any_min_p: bool
    adjusts: bool  # some request has logit bias, penalties or min_new_tokens (see adjust_logits)
    unseeded: torch.Tensor | None  # [u] int64 rows (of the n) without a generator; None when all or none
    all_unseeded: bool
    seeded: list[tuple[int, torch.Generator]]  # (row of the n, its generator), in row order

    @staticmethod
    def build(reqs: list[Req], vocab: int, device: torch.device) -> BatchParams:
        sampled = [i for i, r in enumerate(reqs) if not r.params.greedy]
        ps = [reqs[i].params for i in sampled]
        top_k = [min(p.top_k, vocab) if p.top_k > 0 else vocab for p in ps]
        has_k = [p.top_k > 0 for p in ps]
        has_p = [p.top_p < 1.0 for p in ps]
        seeded = [(j, reqs[i].generator) for j, i in enumerate(sampled) if reqs[i].generator is not None]
        unseeded = [j for j, i in enumerate(sampled) if reqs[i].generator is None]

        def col(values, dtype):
            return torch.tensor(values, dtype=dtype, device=device).view(-1, 1)

        return BatchParams(
            reqs=list(reqs), sampled=sampled,
            rows=None if len(sampled) == len(reqs) else torch.tensor(sampled, dtype=torch.int64, device=device),
            temperature=col([p.temperature for p in ps], torch.float32),
            top_k=col(top_k, torch.int64),
            top_p=col([p.top_p if p.top_p < 1.0 else float("inf") for p in ps], torch.float32),
            min_p=col([p.min_p for p in ps], torch.float32),
            no_k_or_p=col([not (k or q) for k, q in zip(has_k, has_p)], torch.bool),
            top_p_only=torch.tensor([q and not k for k, q in zip(has_k, has_p)], dtype=torch.bool, device=device),
            max_top_k=max((k for k, on in zip(top_k, has_k) if on), default=0),
            any_top_p_only=any(q and not k for k, q in zip(has_k, has_p)), any_top_p=any(has_p),
            any_min_p=any(p.min_p > 0 for p in ps),
            adjusts=any(r.params.adjusts_logits for r in reqs),
            unseeded=torch.tensor(unseeded, dtype=torch.int64, device=device) if seeded and unseeded else None,
            all_unseeded=not seeded, seeded=seeded)

    def num_candidates(self, vocab: int, candidates: int) -> int:
        """How many of each row's largest tokens top-k / top-p look at: the largest top_k, and at least
        `candidates` when a row asks for top_p without top_k."""
        return min(vocab, max(self.max_top_k, candidates if self.any_top_p_only else 0))

    def fits(self, reqs: list[Req]) -> bool:
        return len(reqs) == len(self.reqs) and all(a is b for a, b in zip(reqs, self.reqs))


class Sampler:
    """`sample` with the BatchParams of the last KEEP batches kept while a batch holds the same requests
    (a request's params and generator do not change after it is made). Two, so that a decode batch and
    the prefill batches between its steps do not rebuild each other's."""

    KEEP = 2

    def __init__(self, candidates: int | None = None, kernels: bool | None = None):
        self.candidates = candidates
        self.kernels = kernels  # the Triton draw; None: on CUDA
        self._kept: list[BatchParams] = []  # most recent first

    def __call__(self, logits: torch.Tensor, reqs: list[Req], eos_ids: tuple[int, ...],
                 mask: torch.Tensor | None = None) -> torch.Tensor:
        kernels = logits.is_cuda if self.kernels is None else self.kernels
        return sample(logits, reqs, eos_ids, mask, params=self.params_for(reqs, logits), candidates=self.candidates,
                      kernels=kernels)

    def params_for(self, reqs: list[Req], logits: torch.Tensor) -> BatchParams:
        for i, params in enumerate(self._kept):
            if params.fits(reqs) and params.top_k.device == logits.device:
                self._kept.insert(0, self._kept.pop(i))
                return params
        params = BatchParams.build(reqs, logits.shape[-1], logits.device)
        self._kept = [params] + self._kept[: self.KEEP - 1]
        return params


def sample(logits: torch.Tensor, reqs: list[Req], eos_ids: tuple[int, ...], mask: torch.Tensor | None = None, *,
           params: BatchParams | None = None, candidates: int | None = None, kernels: bool = False) -> torch.Tensor:
    """logits: [N, V] float32 (not modified); mask: [N, ceil(V / 32)] int32 token bitmask on logits'
    device (constrained/bitmask.py), or None; params: BatchParams.build(reqs, V, device) when the caller
    keeps it (Sampler); candidates: the torch path's for top_p rows without top_k (None: CANDIDATES; the
    kernels take none for them); kernels: draw with the Triton kernels (CUDA, or the interpreter). Returns
    next token ids [N] int64 on logits' device, drawn as sample_ref draws."""
    if candidates is None:
        candidates = CANDIDATES
    if params is None:
        params = BatchParams.build(reqs, logits.shape[-1], logits.device)
    assert len(params.reqs) == len(reqs) == logits.shape[0], f"{len(reqs)} requests for logits {tuple(logits.shape)}"
    if mask is not None:
        logits = apply_token_bitmask(logits, mask)
    if params.adjusts:
        logits = adjust_logits(logits, reqs, eos_ids)
    if not params.sampled:
        return logits.argmax(dim=-1)
    sub = logits if params.rows is None else logits[params.rows]  # [n, V]
    if kernels:
        drawn = _draw_with_kernels(sub.float().contiguous(), params)
    else:
        scores = _kept_probs(sub, reqs, params, candidates)
        drawn = (scores / _noise(scores, params)).argmax(dim=-1)
    if params.rows is None:
        return drawn
    out = logits.argmax(dim=-1)
    out[params.rows] = drawn
    return out


def _kept_probs(sub: torch.Tensor, reqs: list[Req], params: BatchParams, candidates: int) -> torch.Tensor:
    """sub: [n, V] logits of the sampled rows. [n, V] probabilities after temperature with zeros outside
    top-k / top-p / min-p: sample_ref's filtered distribution, not renormalized (the draw does not need it)."""
    probs = (sub / params.temperature).softmax(dim=-1)
    keep, fallback = _keep(probs, params, candidates)
    if keep is None:
        return probs
    probs = probs.masked_fill_(~keep, 0.0)
    if fallback:  # top_p rows whose boundary lies past the candidates: the full sort, as sample_ref
        idx = torch.tensor(fallback, dtype=torch.int64, device=sub.device)
        probs[idx] = filtered_probs(sub[idx], [reqs[params.sampled[j]] for j in fallback])
    return probs


def _keep(probs: torch.Tensor, params: BatchParams, candidates: int) -> tuple[torch.Tensor | None, list[int]]:
    """probs: [n, V]. (keep [n, V] bool, or None to keep all; rows j that need the full sort)."""
    n, vocab = probs.shape
    keep = None
    if params.any_min_p:
        # sample_ref compares with the largest probability, which top-k and top-p always keep
        threshold = params.min_p * probs.amax(dim=-1, keepdim=True)  # [n, 1]
        keep = probs >= threshold
    if not (params.max_top_k or params.any_top_p):
        return keep, []
    k = params.num_candidates(vocab, candidates)
    vals = probs.topk(k, dim=-1).values  # [n, k], descending: the first k of sample_ref's sorted row
    # without top_k, top_p is a fraction of the whole row's mass
    row_mass = probs.sum(dim=-1, keepdim=True) if params.any_top_p_only and k < vocab else None
    m, bound, need = _prefix_bound(vals, vals, params.top_k, params.top_p, params.top_p_only, row_mass)
    bound = bound.masked_fill(params.no_k_or_p, -1.0)  # rows without top-k/top-p keep every token
    at = probs == bound
    prefix_keep = (probs > bound) | (at & (at.cumsum(dim=-1, dtype=torch.int32) <= need))
    keep = prefix_keep if keep is None else keep & prefix_keep
    fallback: list[int] = []
    if params.any_top_p_only and k < vocab:
        past = params.top_p_only & (m[:, 0] == k)  # every candidate kept: the boundary may lie beyond
        if params.any_min_p:
            past &= vals[:, -1] >= threshold[:, 0]  # unless min-p already stops inside the candidates
        fallback = past.nonzero().flatten().tolist()  # a host sync in every batch with a top_p-only row
    return keep, fallback


def _prefix_bound(keys: torch.Tensor, weights: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                  top_p_only: torch.Tensor, row_mass: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """The prefix that top-k and top-p keep of each row's candidates. keys: [n, k] the candidates'
    probabilities or logits, descending; weights: [n, k] their probabilities, to any common scale per
    row; top_k, top_p: [n, 1]; top_p_only: [n] bool, rows whose top_p is a fraction of row_mass [n, 1]
    (the whole row's mass, on that scale) rather than of the top-k's. Returns (count, bound, need),
    each [n, 1]: how many tokens are kept, the smallest kept key, and how many tokens equal to it are
    kept (the lowest ids, as a stable sort keeps them)."""
    in_k = torch.arange(keys.shape[1], device=keys.device) < top_k  # [n, k]
    kept = weights.masked_fill(~in_k, 0.0)
    total = kept.sum(dim=-1, keepdim=True)  # a top_k row's kept mass
    if row_mass is not None:
        total = torch.where(top_p_only[:, None], row_mass, total)
    before = kept.cumsum(dim=-1) - kept  # mass strictly before each candidate
    count = (in_k & (before <= top_p * total)).sum(dim=-1, keepdim=True)  # a prefix (rank 0 always)
    bound = keys.gather(1, count - 1)
    return count, bound, count - (keys > bound).sum(dim=-1, keepdim=True)


def _draw_with_kernels(sub: torch.Tensor, params: BatchParams) -> torch.Tensor:
    """sub: [n, V] float32 logits of the sampled rows. The token each row draws [n] int64: the boundary of
    top-k (and top-p within it) among the largest logits, then the Triton draw; top_p rows without top_k race
    (_draw_racing_top_p_rows)."""
    n, vocab = sub.shape
    temperature = params.temperature[:, 0]
    k = min(vocab, params.max_top_k)  # candidates for the top_k rows only
    group_max = None
    if n >= GROUP_CANDIDATES_MIN_ROWS and k and 4 * k * GROUP <= vocab:
        group_max = torch.empty(n, -(-vocab // GROUP), dtype=torch.float32, device=sub.device)
    row_max, mass = row_stats(logits=sub, temperature=temperature, group_max=group_max)
    if not k:  # every finite logit
        bound, need = sub.new_full((n, 1), float("-inf")), torch.zeros(n, 1, dtype=torch.int64, device=sub.device)
    else:
        # [n, k] descending logits
        keys = sub.topk(k, dim=-1).values if group_max is None else top_logits(logits=sub, group_max=group_max, k=k)
        weights = torch.exp(keys / params.temperature - row_max[:, None])  # probabilities times the row's mass
        _, bound, need = _prefix_bound(keys, weights, params.top_k, params.top_p, params.top_p_only, None)
        bound = bound.masked_fill(params.no_k_or_p, float("-inf"))
        need = need.masked_fill(params.no_k_or_p, 0)
    if params.any_top_p_only:
        return _draw_racing_top_p_rows(sub, params, row_max, mass, bound, need, ties=bool(k))
    return draw_kept(logits=sub, noise=_noise(sub, params), temperature=temperature, row_max=row_max,
                     bound=bound, need=need, min_p=params.min_p, ties=bool(k))


def _draw_racing_top_p_rows(sub: torch.Tensor, params: BatchParams, row_max: torch.Tensor, mass: torch.Tensor,
                            bound: torch.Tensor, need: torch.Tensor, ties: bool) -> torch.Tensor:
    """_draw_with_kernels' draw where top_p rows without top_k (params.top_p_only) race over every token (bound -inf):
    the winner over the kept tokens is the first of the race's TOP_P_RACE_CANDIDATES best tokens that top-p keeps,
    the token that the boundary's draw gives. Rows where none of them is kept get the boundary by the radix search
    and draw again; every kernel's programs of the other rows return at once, so nothing waits for the device.
    sub: [n, V] float32 logits; row_max, mass: [n] (row_stats); bound, need: [n, 1], the top_k rows' boundaries
    (-inf / 0 elsewhere); ties: some row has a finite bound."""
    n, vocab = sub.shape
    temperature, min_p, racing = params.temperature[:, 0], params.min_p[:, 0], params.top_p_only
    target = params.top_p[:, 0] * mass
    noise = _noise(sub, params)
    bound = bound.masked_fill(racing[:, None], float("-inf"))
    need = need.masked_fill(racing[:, None], 0)
    group_best = torch.empty(n, -(-vocab // GROUP), dtype=torch.float32, device=sub.device)
    drawn = draw_kept(logits=sub, noise=noise, temperature=temperature, row_max=row_max, bound=bound, need=need,
                      min_p=min_p, ties=ties, group_best=group_best)
    token, found = top_p_race(logits=sub, noise=noise, temperature=temperature, row_max=row_max, target=target,
                              min_p=min_p, flag=racing, group_best=group_best, k=TOP_P_RACE_CANDIDATES)
    drawn = torch.where(found, token, drawn)
    searched = racing & ~found
    top_p_bound(logits=sub, temperature=temperature, row_max=row_max, target=target, flag=searched,
                bound=bound.view(-1), need=need.view(-1))
    again = draw_kept(logits=sub, noise=noise, temperature=temperature, row_max=row_max, bound=bound, need=need,
                      min_p=min_p, flag=searched)
    return torch.where(searched, again, drawn)


def _noise(probs: torch.Tensor, params: BatchParams) -> torch.Tensor:
    """Exp(1) noise [n, V]: unseeded rows from the default generator in one draw, then each seeded
    row from its own generator (sample_ref's order, so both consume the generators alike)."""
    if params.all_unseeded:
        return torch.empty_like(probs).exponential_()
    noise = torch.empty_like(probs)
    if params.unseeded is not None:
        noise[params.unseeded] = probs.new_empty((params.unseeded.numel(), probs.shape[-1])).exponential_()
    for j, gen in params.seeded:
        noise[j].exponential_(generator=gen)
    return noise


def sample_ref(logits: torch.Tensor, reqs: list[Req], eos_ids: tuple[int, ...],
               mask: torch.Tensor | None = None) -> torch.Tensor:
    """Reference of `sample` (same arguments): sorts the whole vocabulary of every sampled row."""
    if mask is not None:
        logits = apply_token_bitmask(logits, mask)
    logits = adjust_logits(logits, reqs, eos_ids)
    out = logits.argmax(dim=-1)
    sampled = [i for i, r in enumerate(reqs) if not r.params.greedy]
    if not sampled:
        return out
    rows = torch.tensor(sampled, device=logits.device)
    sub = [reqs[i] for i in sampled]
    probs = filtered_probs(logits[rows], sub)
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


def adjust_logits(logits: torch.Tensor, reqs: list[Req], eos_ids: tuple[int, ...]) -> torch.Tensor:
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


def filtered_probs(logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
    """[n, V] probabilities after temperature, top-k, top-p and min-p (renormalized)."""
    temperature, top_k, top_p, min_p = row_filters(reqs, logits.shape[-1], logits.device).unbind(1)
    return filtered_probs_rows(logits, temperature, top_k, top_p, min_p)


def row_filters(reqs: list[Req], vocab: int, device: torch.device) -> torch.Tensor:
    """[n, 4] float32: each request's temperature (1 for greedy ones), top-k (the vocabulary when off), top-p
    (inf when off: top_p = 1 keeps every token, the rounding of a cumsum against the sum must not drop the tail)
    and min-p, as filtered_probs_rows takes them."""
    rows = [(r.params.temperature if not r.params.greedy else 1.0,
             min(r.params.top_k, vocab) if r.params.top_k > 0 else vocab,
             r.params.top_p if r.params.top_p < 1.0 else float("inf"), r.params.min_p) for r in reqs]
    return torch.tensor(rows, dtype=torch.float32).to(device, non_blocking=True)


def filtered_probs_rows(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                        min_p: torch.Tensor) -> torch.Tensor:
    """logits [n, V] and each row's filters [n] (row_filters) -> [n, V] probabilities; device work only."""
    probs = (logits / temperature[:, None]).softmax(dim=-1)
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)  # ties: lower id first
    rank = torch.arange(probs.shape[-1], device=logits.device)[None, :]
    sorted_p = sorted_p.masked_fill(rank >= top_k[:, None], 0.0)
    before = sorted_p.cumsum(dim=-1) - sorted_p  # mass strictly before each token
    sorted_p = sorted_p.masked_fill(before > top_p[:, None] * sorted_p.sum(-1, keepdim=True), 0.0)
    sorted_p = sorted_p.masked_fill(sorted_p < min_p[:, None] * sorted_p[:, :1], 0.0)
    return torch.zeros_like(probs).scatter_(1, order, sorted_p / sorted_p.sum(-1, keepdim=True))


def _log_softmax(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """float32 log_softmax of logits [N, V] over the tokens `mask` allows (every token when None)."""
    logits = logits.float()
    if mask is not None:
        logits = apply_token_bitmask(logits, mask)
    return logits.log_softmax(dim=-1)


def ids_logprobs(logits: torch.Tensor, id_lists: list[list[int] | None],
                 mask: torch.Tensor | None = None) -> list[list[tuple[float, int]]]:
    """logits: [N, V]; id_lists[i]: token ids for row i, or None; mask: the rows' grammar bitmask, or None.
    (logprob, id) of each id in its row (-inf for a token the grammar forbids)."""
    rows = [i for i, ids in enumerate(id_lists) if ids]
    out: list[list[tuple[float, int]]] = [[] for _ in id_lists]
    if rows:
        idx = torch.tensor(rows, device=logits.device)
        logp = _log_softmax(logits[idx], None if mask is None else mask[idx])
        for k, i in enumerate(rows):
            out[i] = list(zip(logp[k, id_lists[i]].tolist(), id_lists[i]))
    return out


def logprobs_of(logits: torch.Tensor, ids: torch.Tensor, top_k: int,
                mask: torch.Tensor | None = None) -> tuple[list[float], list[list]]:
    """logits: [N, V]; ids: [N]; mask: [N, ceil(V / 32)] grammar bitmask of the rows, or None. Returns the
    logprob of ids[i] in row i, and (when top_k > 0) up to top_k (logprob, token id) pairs of each row:
    with a mask, of the masked distribution, and only tokens the mask allows."""
    logp = _log_softmax(logits, mask)
    chosen = logp.gather(1, ids.view(-1, 1)).flatten().tolist()
    if top_k <= 0:
        return chosen, [[] for _ in chosen]
    vals, idx = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
    tops = [list(zip(v, i)) for v, i in zip(vals.tolist(), idx.tolist())]
    if mask is not None:  # a row with fewer allowed tokens than top_k: its forbidden ones come last, at -inf
        tops = [[(v, i) for v, i in row if v != float("-inf")] for row in tops]
    return chosen, tops
