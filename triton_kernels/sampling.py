"""The vocabulary-wide passes of sampling (runner/sampler.py), in logit space and without a sort.

row_stats:  per row, m = max(logits / T) and the mass sum(exp(logits / T - m)), in one read; optionally
            also the max logit of each group of GROUP consecutive tokens (top_logits' index).
top_logits: the k largest logits of each row, from the group maxima: the k groups with the largest
            maxima hold every one of the k largest values (torch.topk over [n, V / GROUP], a gather of
            k * GROUP logits, torch.topk over those) where torch.topk over [n, V] makes several passes.
draw_kept:  per row, the exponential race argmax_i w_i / E_i over the kept tokens, w_i = exp(l_i / T - m):
            kept = (l > bound) or (l == bound and among the first `need` such tokens by id), and w_i >= min_p
            (min-p relative to the largest probability, whose w is 1). Ties of the race go to the lower id.

The sampler finds (bound, need) from the top-k / top-p candidates (top_p rows without top_k: top_p.py); these
kernels then read the logits once each and the noise once, where the torch path writes and reads [n, V] masks
several times (among them an integer scan over the vocabulary for the ties at the boundary).

Each row is split into chunks of CHUNK entries, one program each, so a batch of one still fills the
GPU. Row statistics come back per chunk and torch combines them ([n, chunks]); the draw first counts
each chunk's ties at the bound (a third read, only when some row has top-k / top-p), so that a program
knows how many ties precede its chunk, and folds its chunk's winner into the row's result by an
atomic max over (score bits, inverted id).
"""

import torch
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.host_math import cdiv, next_power_of_2

GROUP = 16  # tokens per group maximum (top_logits)
BLOCK = 1024  # vocabulary entries per loop step
CHUNK = 8192  # vocabulary entries per program: a row takes ceil(V / CHUNK) programs
NUM_WARPS = 4


def row_stats_ref(*, logits: torch.Tensor, temperature: torch.Tensor,
                  group_max: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [n, V] float32; temperature: [n] float32 (> 0). Returns (m [n], mass [n]) float32:
    m = max(logits / T), mass = sum(exp(logits / T - m)). group_max: None, or [n, ceil(V / GROUP)] float32
    filled with the max logit of each group of GROUP tokens (the last group may be partial)."""
    scaled = logits / temperature[:, None]
    m = scaled.amax(dim=-1)
    if group_max is not None:
        n, vocab = logits.shape
        padded = logits.new_full((n, group_max.shape[1] * GROUP), float("-inf"))
        padded[:, :vocab] = logits
        group_max.copy_(padded.view(n, -1, GROUP).amax(dim=-1))
    return m, torch.exp(scaled - m[:, None]).sum(dim=-1)


def top_logits(*, logits: torch.Tensor, group_max: torch.Tensor, k: int) -> torch.Tensor:
    """logits: [n, V] float32; group_max: [n, ceil(V / GROUP)] from row_stats; k <= ceil(V / GROUP).
    Returns the k largest logits of each row [n, k], descending: the values torch.topk(logits, k) gives.
    Every logit above the k-th largest value v lies in a group whose max is above v, and there are fewer
    than k of those, so the k groups with the largest maxima hold them all, and (each selected group with
    max v holding one) at least as many logits equal to v as the k largest have."""
    n, vocab = logits.shape
    groups = group_max.topk(k, dim=-1).indices  # [n, k]
    offsets = (groups[:, :, None] * GROUP + torch.arange(GROUP, device=logits.device)).view(n, -1)  # [n, k * G]
    values = logits.gather(1, offsets.clamp(max=vocab - 1)).masked_fill_(offsets >= vocab, float("-inf"))
    return values.topk(k, dim=-1).values


def draw_kept_ref(*, logits: torch.Tensor, noise: torch.Tensor, temperature: torch.Tensor, row_max: torch.Tensor,
                  bound: torch.Tensor, need: torch.Tensor, min_p: torch.Tensor, ties: bool = True) -> torch.Tensor:
    """logits, noise: [n, V] float32 (noise > 0, Exp(1)); temperature, row_max, bound, min_p: [n] float32;
    need: [n] int64; ties: a hint for the kernel (False: every bound is -inf). Returns the drawn token
    ids [n] int64."""
    w = torch.exp(logits / temperature[:, None] - row_max[:, None])
    tie = logits == bound[:, None]
    keep = (logits > bound[:, None]) | (tie & (tie.cumsum(dim=-1) <= need[:, None]))
    keep &= w >= min_p[:, None]
    return torch.where(keep, w / noise, -1.0).argmax(dim=-1)


@cached_launch
@triton.jit
def _row_stats_kernel(l_ptr, l_stride, t_ptr, part_m_ptr, part_s_ptr, group_max_ptr, vocab, num_chunks, num_groups,
                      CHUNK: tl.constexpr, BLOCK: tl.constexpr, GROUPS: tl.constexpr, GROUP: tl.constexpr):
    """Program (row, c): the max m_c of logits / T over chunk c of the row and sum(exp(logits / T - m_c));
    with GROUPS, the max logit of each group of GROUP tokens of the chunk."""
    row, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    t = tl.load(t_ptr + row)
    o = tl.arange(0, BLOCK)
    m_lane = tl.full([BLOCK], float("-inf"), tl.float32)  # per-lane running max and mass
    s_lane = tl.zeros([BLOCK], tl.float32)
    for start in range(c * CHUNK, tl.minimum(c * CHUNK + CHUNK, vocab), BLOCK):
        x = tl.load(l_ptr + row * l_stride + start + o, mask=start + o < vocab, other=float("-inf"))
        if GROUPS:
            o_g = start // GROUP + tl.arange(0, BLOCK // GROUP)
            tl.store(group_max_ptr + row * num_groups + o_g, tl.max(tl.reshape(x, (BLOCK // GROUP, GROUP)), 1),
                     mask=o_g < num_groups)
        x = tl.math.div_rn(x, t)  # rounded as torch divides
        m_new = tl.maximum(m_lane, x)
        m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)  # a lane without a finite value yet stays at 0
        s_lane = s_lane * tl.exp(m_lane - m_ref) + tl.exp(x - m_ref)
        m_lane = m_new
    m = tl.max(m_lane, 0)
    m_ref = tl.where(m > float("-inf"), m, 0.0)
    tl.store(part_m_ptr + row * num_chunks + c, m)
    tl.store(part_s_ptr + row * num_chunks + c, tl.sum(s_lane * tl.exp(m_lane - m_ref), 0))


def row_stats(*, logits: torch.Tensor, temperature: torch.Tensor, group_max: torch.Tensor | None = None,
              chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """Same as row_stats_ref: the same max and group maxima, and the mass up to summation order. Each
    program reduces one chunk of a row; torch combines the [n, chunks] partials."""
    n, vocab = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1, (logits.dtype, logits.stride())
    block = max(min(BLOCK, chunk, next_power_of_2(vocab)), GROUP)
    assert chunk % block == 0, f"chunk {chunk} must be a multiple of the block {block}"
    num_groups = cdiv(vocab, GROUP)
    assert group_max is None or (group_max.shape == (n, num_groups) and group_max.is_contiguous()), group_max.shape
    num_chunks = cdiv(vocab, chunk)
    part_m = torch.empty(n, num_chunks, dtype=torch.float32, device=logits.device)
    part_s = torch.empty_like(part_m)
    if n:
        _row_stats_kernel[(n, num_chunks)](logits, logits.stride(0), temperature.reshape(-1).float().contiguous(),
                                           part_m, part_s, part_m if group_max is None else group_max, vocab,
                                           num_chunks, num_groups, CHUNK=chunk, BLOCK=block,
                                           GROUPS=group_max is not None, GROUP=GROUP, num_warps=NUM_WARPS)
    m = part_m.amax(dim=-1)
    return m, (part_s * torch.exp(part_m - m[:, None])).sum(dim=-1)


@triton.jit
def _weight(x, t, m):
    """The race's weight of logit x: exp(x / T - m), the division rounded as torch rounds it. The draw, the race's
    candidates and the search's boundary all take it from here, so they agree to the bit."""
    return tl.exp(tl.math.div_rn(x, t) - m)


@triton.jit
def _chunk_end(flag_ptr, row, c, vocab, CHUNK: tl.constexpr, FLAGGED: tl.constexpr):
    """Where chunk c of the row ends; with FLAGGED, where it starts for a row whose flag is 0 (no loop steps)."""
    end = tl.minimum(c * CHUNK + CHUNK, vocab)
    if FLAGGED:
        end = tl.where(tl.load(flag_ptr + row) != 0, end, c * CHUNK)
    return end


@cached_launch
@triton.jit
def _tie_count_kernel(l_ptr, l_stride, bound_ptr, flag_ptr, counts_ptr, vocab, num_chunks, CHUNK: tl.constexpr,
                      BLOCK: tl.constexpr, FLAGGED: tl.constexpr):
    """Program (row, c): how many logits of chunk c equal the row's bound (FLAGGED: 0 in unflagged rows)."""
    row, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    bound = tl.load(bound_ptr + row)
    o = tl.arange(0, BLOCK)
    count = tl.zeros([BLOCK], tl.int32)
    for start in range(c * CHUNK, _chunk_end(flag_ptr, row, c, vocab, CHUNK, FLAGGED), BLOCK):
        x = tl.load(l_ptr + row * l_stride + start + o, mask=start + o < vocab, other=float("nan"))
        count += (x == bound).to(tl.int32)
    tl.store(counts_ptr + row * num_chunks + c, tl.sum(count, 0))


@cached_launch
@triton.jit
def _draw_kept_kernel(l_ptr, l_stride, e_ptr, e_stride, t_ptr, m_ptr, bound_ptr, need_ptr, min_p_ptr, counts_ptr,
                      keys_ptr, group_best_ptr, flag_ptr, vocab, num_chunks, num_groups, TIES: tl.constexpr,
                      CHUNK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_C: tl.constexpr, GROUP_BEST: tl.constexpr,
                      GROUP: tl.constexpr, FLAGGED: tl.constexpr):
    """Program (row, c): the race's winner in chunk c, folded into the row's key by an atomic max; the key
    is the score's float bits (non-negative, so ordered as integers) above 2^32 - 1 - token id. GROUP_BEST:
    also the best score (-1: none kept) of each group of GROUP tokens. FLAGGED: unflagged rows draw nothing."""
    row, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    t = tl.load(t_ptr + row)
    m = tl.load(m_ptr + row)
    bound = tl.load(bound_ptr + row)
    need = tl.load(need_ptr + row).to(tl.int32)
    min_p = tl.load(min_p_ptr + row)
    ties = tl.full([], 0, tl.int32)  # tokens equal to bound before this point of the row
    if TIES:
        o_c = tl.arange(0, BLOCK_C)
        ties = tl.sum(tl.load(counts_ptr + row * num_chunks + o_c, mask=o_c < c, other=0), 0)
    o = tl.arange(0, BLOCK)
    best = tl.full([], -1.0, tl.float32)
    best_id = tl.full([], 0, tl.int32)
    for start in range(c * CHUNK, _chunk_end(flag_ptr, row, c, vocab, CHUNK, FLAGGED), BLOCK):
        valid = start + o < vocab
        x = tl.load(l_ptr + row * l_stride + start + o, mask=valid, other=float("-inf"))
        e = tl.load(e_ptr + row * e_stride + start + o, mask=valid, other=1.0)
        w = _weight(x, t, m)
        keep = x > bound
        if TIES:
            tie = (x == bound) & valid
            keep |= tie & (ties + tl.cumsum(tie.to(tl.int32), 0) <= need)  # the first `need` ties by id
            ties += tl.sum(tie.to(tl.int32), 0)
        keep &= (w >= min_p) & valid
        score = tl.where(keep, w / e, -1.0)
        if GROUP_BEST:
            o_g = start // GROUP + tl.arange(0, BLOCK // GROUP)
            tl.store(group_best_ptr + row * num_groups + o_g, tl.max(tl.reshape(score, (BLOCK // GROUP, GROUP)), 1),
                     mask=o_g < num_groups)
        block_best = tl.max(score, 0)
        take = block_best > best  # strictly: an earlier block keeps an equal score (lower id)
        best_id = tl.where(take, start + tl.argmax(score, 0), best_id)
        best = tl.where(take, block_best, best)
    if best >= 0:
        key = (best.to(tl.int32, bitcast=True).to(tl.int64) << 32) | (4294967295 - best_id.to(tl.int64))
        tl.atomic_max(keys_ptr + row, key)


def draw_kept(*, logits: torch.Tensor, noise: torch.Tensor, temperature: torch.Tensor, row_max: torch.Tensor,
              bound: torch.Tensor, need: torch.Tensor, min_p: torch.Tensor, ties: bool = True,
              group_best: torch.Tensor | None = None, flag: torch.Tensor | None = None,
              chunk: int = CHUNK) -> torch.Tensor:
    """Same as draw_kept_ref: the same token, up to a float near-tie of two tokens' w / E (exp may round
    differently from torch's). ties=False says that every row's bound is -inf (no top-k / top-p), which
    skips the tie count. group_best: None, or [n, ceil(V / GROUP)] float32 filled with the best score w / E
    of each group of GROUP tokens (-1 where the group keeps none; top_p_race's index). flag: None, or [n]
    bool: only the flagged rows draw (the others' ids are meaningless and group_best is not written)."""
    n, vocab = logits.shape
    assert logits.dtype == noise.dtype == torch.float32 and noise.shape == logits.shape, (logits.dtype, noise.dtype)
    assert logits.stride(1) == 1 and noise.stride(1) == 1 and vocab < 2 ** 31
    temperature, row_max, bound, need, min_p = (
        t.reshape(-1).contiguous() for t in (temperature.float(), row_max.float(), bound.float(), need, min_p.float()))
    block = max(min(BLOCK, chunk, next_power_of_2(vocab)), GROUP)
    assert chunk % block == 0, f"chunk {chunk} must be a multiple of the block {block}"
    num_chunks, num_groups = cdiv(vocab, chunk), cdiv(vocab, GROUP)
    assert group_best is None or (group_best.shape == (n, num_groups) and group_best.is_contiguous()), group_best
    flags = flag.reshape(-1).to(torch.int8) if flag is not None else need  # (unread without a flag)
    counts = torch.empty(n, num_chunks, dtype=torch.int32, device=logits.device)
    keys = torch.full((n,), -1, dtype=torch.int64, device=logits.device)
    if n and ties:
        _tie_count_kernel[(n, num_chunks)](logits, logits.stride(0), bound, flags, counts, vocab, num_chunks,
                                           CHUNK=chunk, BLOCK=block, FLAGGED=flag is not None, num_warps=NUM_WARPS)
    if n:
        _draw_kept_kernel[(n, num_chunks)](logits, logits.stride(0), noise, noise.stride(0), temperature, row_max,
                                           bound, need, min_p, counts, keys,
                                           keys if group_best is None else group_best, flags, vocab, num_chunks,
                                           num_groups, TIES=ties, CHUNK=chunk, BLOCK=block,
                                           BLOCK_C=next_power_of_2(num_chunks),
                                           GROUP_BEST=group_best is not None, GROUP=GROUP, FLAGGED=flag is not None,
                                           num_warps=NUM_WARPS)
    return 0xFFFFFFFF - (keys & 0xFFFFFFFF)
