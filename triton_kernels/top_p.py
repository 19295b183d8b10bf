"""The top-p boundary of rows whose kept mass reaches past any few candidates (runner/sampler.py: top_p rows
without top_k), on the device and without a sort, with the sampling passes of sampling.py.

top_p_race:  the race's winner among a row's kept tokens without the boundary: the first of the race's
             best-scoring tokens (draw_kept's group_best) whose mass before it in the sorted row is within top_p,
             the mass before each of them summed in one read of the row. Each is kept with probability about top_p.
top_p_bound: for the rows where none of them is kept, the boundary itself, by a radix search over the ordered
             float keys (one digit per read of the row); the row then draws again (draw_kept with its flag).

Neither reads anything back to the host: programs of rows not flagged return at once.
"""

import torch
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.host_math import cdiv, next_power_of_2
from triton_kernels.sampling import CHUNK, GROUP, NUM_WARPS, _chunk_end, _weight

BOUND_BLOCK = 256  # top_p_bound's loop step (times the radix's buckets per entry)
RACE_BLOCK = 256  # top_p_race's loop step (times its candidates per entry)


def top_p_bound_ref(*, logits: torch.Tensor, temperature: torch.Tensor, row_max: torch.Tensor, target: torch.Tensor,
                    flag: torch.Tensor, bound: torch.Tensor, need: torch.Tensor) -> None:
    """The top-p boundary of the flagged rows, from their fully sorted logits, written into bound and need.
    logits: [n, V] float32; temperature, row_max, target: [n] float32, target = top_p times the row's mass
    sum(exp(logits / T - row_max)); flag: [n] bool; bound: [n] float32 and need: [n] int64, changed in the
    flagged rows only: the smallest kept logit, and how many logits equal to it are kept (the lowest ids),
    where a token is kept while the mass before it in the sorted row is at most target."""
    rows = flag.nonzero().flatten()
    if not rows.numel():
        return
    keys = logits[rows].sort(dim=-1, descending=True).values
    w = torch.exp(keys / temperature[rows, None] - row_max[rows, None])
    count = ((w.cumsum(dim=-1) - w) <= target[rows, None]).sum(dim=-1, keepdim=True)
    b = keys.gather(1, count - 1)
    bound[rows] = b[:, 0]
    need[rows] = (count - (keys > b).sum(dim=-1, keepdim=True))[:, 0]


@triton.jit
def _radix_key(x):
    """float32 -> int32 bits that order as unsigned integers as the floats do (-inf lowest; no NaN here)."""
    bits = x.to(tl.int32, bitcast=True)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF) ^ (tl.full([], 1, tl.int32) << 31)  # ordered as signed; sign flipped


@triton.jit
def _radix_value(key):
    """The float32 whose _radix_key is key."""
    bits = key ^ (tl.full([], 1, tl.int32) << 31)
    return (bits ^ ((bits >> 31) & 0x7FFFFFFF)).to(tl.float32, bitcast=True)


@triton.jit
def _radix_choose(hist_ptr, prefix_ptr, above_ptr, target, row, n, num_chunks, buf, shift,
                  BLOCK_C: tl.constexpr, RADIX: tl.constexpr):
    """The previous pass's digit (at bit `shift`) of the boundary's key: of the buckets that hold mass, the
    lowest whose mass above it (the mass above the prefix, plus the higher buckets') is at most target.
    Returns the prefix with that digit set, the mass above it (above the new prefix's range), and the digit."""
    o_c = tl.arange(0, BLOCK_C)
    o_r = tl.arange(0, RADIX)
    base = (buf * n + row) * num_chunks
    h = tl.sum(tl.load(hist_ptr + (base + o_c[:, None]) * RADIX + o_r[None, :], mask=o_c[:, None] < num_chunks,
                       other=0.0), 0)  # [RADIX], summed over the chunks in order
    prefix = tl.load(prefix_ptr + buf * n + row)
    above = tl.load(above_ptr + buf * n + row)
    higher = tl.sum(tl.where(o_r[None, :] > o_r[:, None], h[None, :], 0.0), 1)  # [RADIX] mass in higher buckets
    fits = (h > 0) & (above + higher <= target)
    digit = tl.min(tl.where(fits, o_r, RADIX - 1), 0)  # the highest bucket with mass always fits
    return prefix | (digit << shift), above + tl.sum(tl.where(o_r == digit, higher, 0.0), 0), digit


@cached_launch
@triton.jit(do_not_specialize=["n"])  # n rows: one compiled kernel for every batch size (warmed up at start)
def _top_p_pass_kernel(l_ptr, l_stride, t_ptr, m_ptr, target_ptr, flag_ptr, hist_ptr, count_ptr, prefix_ptr,
                       above_ptr, n, vocab, num_chunks, p, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                       BLOCK_C: tl.constexpr, RADIX: tl.constexpr, DIGIT_BITS: tl.constexpr, LAST: tl.constexpr):
    """Pass p, program (row, c) of a flagged row: take the previous pass's digit (from every chunk's
    histogram, in buffer (p - 1) % 2), then the mass histogram of the next digit over the chunk's logits
    whose key has the prefix so far (buffer p % 2; LAST: also the counts). Program c = 0 keeps the prefix."""
    row, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    if tl.load(flag_ptr + row) != 0:
        t = tl.load(t_ptr + row)
        m = tl.load(m_ptr + row)
        shift = 32 - DIGIT_BITS * (p + 1)
        prefix = tl.full([], 0, tl.int32)
        if p > 0:
            prefix, above, _ = _radix_choose(hist_ptr, prefix_ptr, above_ptr, tl.load(target_ptr + row), row, n,
                                             num_chunks, (p - 1) % 2, shift + DIGIT_BITS, BLOCK_C, RADIX)
            if c == 0:
                tl.store(prefix_ptr + (p % 2) * n + row, prefix)
                tl.store(above_ptr + (p % 2) * n + row, above)
        elif c == 0:
            tl.store(prefix_ptr + row, prefix)
            tl.store(above_ptr + row, 0.0)
        o = tl.arange(0, BLOCK)
        o_r = tl.arange(0, RADIX)
        acc = tl.zeros([BLOCK, RADIX], tl.float32)
        cnt = tl.zeros([BLOCK, RADIX], tl.int32)
        inv_t = 1.0 / t  # the weights within rounding of the reference's exp(l / T - m): the passes are ALU-bound
        high = tl.minimum(shift + DIGIT_BITS, 31)
        for start in range(c * CHUNK, tl.minimum(c * CHUNK + CHUNK, vocab), BLOCK):
            x = tl.load(l_ptr + row * l_stride + start + o, mask=start + o < vocab, other=float("-inf"))
            key = _radix_key(x)
            # the digits above this pass's equal the prefix's (equal arithmetic shifts: equal high bits)
            match = ((p == 0) | ((key >> high) == (prefix >> high))) & (start + o < vocab)
            if tl.max(match.to(tl.int32), 0) > 0:  # after the first passes most blocks hold none of the prefix
                digit = tl.where(match, (key >> shift) & (RADIX - 1), RADIX)  # RADIX: no bucket
                hit = digit[:, None] == o_r[None, :]  # [BLOCK, RADIX]
                acc += tl.where(hit, tl.exp(x * inv_t - m)[:, None], 0.0)
                if LAST:
                    cnt += hit.to(tl.int32)
        out = ((p % 2) * n + row) * num_chunks + c
        tl.store(hist_ptr + out * RADIX + o_r, tl.sum(acc, 0))
        if LAST:
            tl.store(count_ptr + (row * num_chunks + c) * RADIX + o_r, tl.sum(cnt, 0))


@cached_launch
@triton.jit(do_not_specialize=["n"])
def _top_p_final_kernel(t_ptr, m_ptr, target_ptr, flag_ptr, hist_ptr, count_ptr, prefix_ptr, above_ptr, bound_ptr,
                        need_ptr, n, vocab, num_chunks, p, BLOCK_C: tl.constexpr, RADIX: tl.constexpr):
    """Program row, for a flagged row: the last digit, so the boundary's key; the bound is its value, and its
    ties are kept (the lowest ids first) while the mass before them stays within target."""
    row = tl.program_id(0).to(tl.int64)
    if tl.load(flag_ptr + row) != 0:
        target = tl.load(target_ptr + row)
        key, above, digit = _radix_choose(hist_ptr, prefix_ptr, above_ptr, target, row, n, num_chunks, (p - 1) % 2, 0,
                                          BLOCK_C, RADIX)
        o_c = tl.arange(0, BLOCK_C)
        ties = tl.sum(tl.load(count_ptr + (row * num_chunks + o_c) * RADIX + digit, mask=o_c < num_chunks, other=0), 0)
        b = _radix_value(key)
        w_b = _weight(b, tl.load(t_ptr + row), tl.load(m_ptr + row))
        room = tl.minimum((target - above) / w_b, vocab).to(tl.int32) + 1  # ties whose mass before fits
        tl.store(bound_ptr + row, b)
        tl.store(need_ptr + row, tl.maximum(tl.minimum(ties, room), 1).to(tl.int64))


def top_p_bound(*, logits: torch.Tensor, temperature: torch.Tensor, row_max: torch.Tensor, target: torch.Tensor,
                flag: torch.Tensor, bound: torch.Tensor, need: torch.Tensor, digit_bits: int = 4,
                chunk: int = CHUNK) -> None:
    """Same as top_p_bound_ref, without reading the flags back to the host: a radix search for the boundary's
    key (the float's bits, ordered), digit_bits per pass (32 / digit_bits passes and a last small kernel).
    Each pass reads the flagged rows' logits once, a program per chunk of a row, into per-chunk mass
    histograms of the next digit; unflagged rows' programs return at once. Bound and need are the
    reference's except where target is within rounding of a cumulative mass (the two sum in different orders)."""
    n, vocab = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1 and bound.is_contiguous() and need.is_contiguous()
    assert 32 % digit_bits == 0, digit_bits
    if not n:
        return
    radix, passes = 1 << digit_bits, 32 // digit_bits
    block = min(BOUND_BLOCK, chunk, next_power_of_2(vocab))
    num_chunks = cdiv(vocab, chunk)
    dev = logits.device
    hist = torch.empty(2, n, num_chunks, radix, dtype=torch.float32, device=dev)
    count = torch.empty(n, num_chunks, radix, dtype=torch.int32, device=dev)
    prefix = torch.empty(2, n, dtype=torch.int32, device=dev)
    above = torch.empty(2, n, dtype=torch.float32, device=dev)
    rows = (temperature.reshape(-1).float().contiguous(), row_max.reshape(-1).float().contiguous(),
            target.reshape(-1).float().contiguous(), flag.reshape(-1).to(torch.int8))
    block_c = next_power_of_2(num_chunks)
    for p in range(passes):
        _top_p_pass_kernel[(n, num_chunks)](logits, logits.stride(0), *rows, hist, count, prefix, above, n, vocab,
                                            num_chunks, p, CHUNK=chunk, BLOCK=block, BLOCK_C=block_c, RADIX=radix,
                                            DIGIT_BITS=digit_bits, LAST=p == passes - 1, num_warps=NUM_WARPS)
    _top_p_final_kernel[(n,)](*rows, hist, count, prefix, above, bound, need, n, vocab, num_chunks, passes,
                              BLOCK_C=block_c, RADIX=radix, num_warps=1)


def top_p_race_ref(*, logits: torch.Tensor, noise: torch.Tensor, temperature: torch.Tensor, row_max: torch.Tensor,
                   target: torch.Tensor, min_p: torch.Tensor, flag: torch.Tensor, group_best: torch.Tensor,
                   k: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """The winner of the race over a top_p row's kept tokens, from the race's k best tokens instead of the
    boundary. logits, noise: [n, V] float32; temperature, row_max, target (top_p times the row's mass), min_p: [n]
    float32; flag: [n] bool, the rows asked for; group_best: as draw_kept writes it for these rows with every
    bound -inf (unread here). Of the k tokens with the largest score w / E among those min-p keeps (descending),
    the first whose mass before it in the row sorted by logit (ties: lower ids first) is at most target: top-p
    keeps it, and every token that scores higher lies outside top-p. Returns (token [n] int64, found [n] bool);
    found is False in unflagged rows and where none of the k is kept (the caller then needs the boundary)."""
    n, vocab = logits.shape
    w = torch.exp(logits / temperature[:, None] - row_max[:, None])
    score = torch.where((logits > float("-inf")) & (w >= min_p[:, None]), w / noise, -1.0)
    best, cand = (t[:, :k] for t in score.sort(dim=-1, descending=True, stable=True))  # [n, k]; ties: lower id first
    order = logits.sort(dim=-1, descending=True, stable=True)
    before = (order.values.new_zeros(n, vocab).scatter_(1, order.indices, torch.exp(
        order.values / temperature[:, None] - row_max[:, None]).cumsum(dim=-1)) - w)  # [n, V] mass before each token
    ok = (before.gather(1, cand) <= target[:, None]) & (best >= 0) & flag[:, None]
    return cand.gather(1, ok.to(torch.int8).argmax(dim=-1, keepdim=True))[:, 0], ok.any(dim=-1)


@cached_launch
@triton.jit
def _race_candidates_kernel(l_ptr, l_stride, e_ptr, e_stride, t_ptr, m_ptr, min_p_ptr, groups_ptr, cand_l_ptr,
                            cand_id_ptr, best_ptr, vocab, num_taken, K: tl.constexpr, GROUP: tl.constexpr,
                            TAKEN: tl.constexpr):
    """Program row: the race's scores over the row's num_taken best groups (draw_kept's arithmetic, so the same
    bits), and the K best of them in order (equal scores: lower id first) with their logits."""
    row = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, TAKEN * GROUP)
    g = tl.load(groups_ptr + row * num_taken + o // GROUP, mask=o // GROUP < num_taken, other=-1)
    ids = g * GROUP + o % GROUP
    valid = (g >= 0) & (ids < vocab)
    x = tl.load(l_ptr + row * l_stride + ids, mask=valid, other=float("-inf"))
    e = tl.load(e_ptr + row * e_stride + ids, mask=valid, other=1.0)
    w = _weight(x, tl.load(t_ptr + row), tl.load(m_ptr + row))
    score = tl.where(valid & (x > float("-inf")) & (w >= tl.load(min_p_ptr + row)), w / e, -1.0)
    ids = tl.where(valid, ids, vocab)  # past every real id
    for j in tl.static_range(K):
        best = tl.max(score, 0)
        pick = tl.min(tl.where(score == best, ids, vocab), 0)
        tl.store(best_ptr + row * K + j, best)
        tl.store(cand_id_ptr + row * K + j, pick.to(tl.int64))
        tl.store(cand_l_ptr + row * K + j, tl.max(tl.where(ids == pick, x, float("-inf")), 0))
        score = tl.where(ids == pick, -2.0, score)


@cached_launch
@triton.jit
def _race_before_kernel(l_ptr, l_stride, t_ptr, m_ptr, flag_ptr, cand_l_ptr, cand_id_ptr, part_ptr, vocab, num_chunks,
                        CHUNK: tl.constexpr, BLOCK: tl.constexpr, K: tl.constexpr):
    """Program (row, c) of a flagged row: for each of the row's K candidates, the mass of chunk c's tokens that the
    sorted row puts before it (a larger logit, or an equal one with a lower id)."""
    row, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    o_k = tl.arange(0, K)
    cand_l = tl.load(cand_l_ptr + row * K + o_k)
    cand_id = tl.load(cand_id_ptr + row * K + o_k)
    inv_t = 1.0 / tl.load(t_ptr + row)  # weights within rounding of exp(l / T - m), as top_p_bound's passes
    m = tl.load(m_ptr + row)
    o = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK, K], tl.float32)
    for start in range(c * CHUNK, _chunk_end(flag_ptr, row, c, vocab, CHUNK, True), BLOCK):
        ids = start + o
        x = tl.load(l_ptr + row * l_stride + ids, mask=ids < vocab, other=float("-inf"))
        w = tl.exp(x * inv_t - m)
        before = (x[:, None] > cand_l[None, :]) | ((x[:, None] == cand_l[None, :]) & (ids[:, None] < cand_id[None, :]))
        acc += tl.where(before, w[:, None], 0.0)
    tl.store(part_ptr + (row * num_chunks + c) * K + o_k, tl.sum(acc, 0))


@cached_launch
@triton.jit
def _race_final_kernel(part_ptr, target_ptr, flag_ptr, best_ptr, cand_id_ptr, token_ptr, found_ptr, num_chunks,
                       K: tl.constexpr, BLOCK_C: tl.constexpr):
    """Program row: the first candidate whose mass before it (the chunks' parts, summed in order) is within target."""
    row = tl.program_id(0).to(tl.int64)
    o_c, o_k = tl.arange(0, BLOCK_C), tl.arange(0, K)
    before = tl.sum(tl.load(part_ptr + (row * num_chunks + o_c[:, None]) * K + o_k[None, :],
                            mask=o_c[:, None] < num_chunks, other=0.0), 0)  # [K]
    ok = (before <= tl.load(target_ptr + row)) & (tl.load(best_ptr + row * K + o_k) >= 0)
    ok &= tl.load(flag_ptr + row) != 0
    first = tl.min(tl.where(ok, o_k, K), 0)
    tl.store(token_ptr + row, tl.sum(tl.where(o_k == first, tl.load(cand_id_ptr + row * K + o_k), 0), 0))
    tl.store(found_ptr + row, (first < K).to(tl.int8))


def top_p_race(*, logits: torch.Tensor, noise: torch.Tensor, temperature: torch.Tensor, row_max: torch.Tensor,
               target: torch.Tensor, min_p: torch.Tensor, flag: torch.Tensor, group_best: torch.Tensor, k: int = 8,
               chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """Same as top_p_race_ref (k a power of two), without sorting: the k groups with the best scores (group_best)
    hold the k best tokens, which a kernel ranks per row; another reads each flagged row once for the mass before
    each of them, and a last one takes the first kept. The same tokens and flags, except where target is within
    rounding of a candidate's mass before it, or the k-th best group ties with another on its best score."""
    n, vocab = logits.shape
    assert k == next_power_of_2(k), k
    assert group_best.shape == (n, cdiv(vocab, GROUP)), group_best.shape
    dev = logits.device
    temperature, row_max, target, min_p = (t.reshape(-1).float().contiguous() for t in (temperature, row_max, target,
                                                                                        min_p))
    flags = flag.reshape(-1).to(torch.int8)
    taken = min(k, group_best.shape[1])
    groups = group_best.topk(taken, dim=-1).indices.contiguous()  # [n, taken]
    cand_l = torch.empty(n, k, dtype=torch.float32, device=dev)
    cand, best = torch.empty(n, k, dtype=torch.int64, device=dev), torch.empty_like(cand_l)
    num_chunks = cdiv(vocab, chunk)
    part = torch.empty(n, num_chunks, k, dtype=torch.float32, device=dev)
    token, found = torch.empty(n, dtype=torch.int64, device=dev), torch.empty(n, dtype=torch.int8, device=dev)
    if n:
        _race_candidates_kernel[(n,)](logits, logits.stride(0), noise, noise.stride(0), temperature, row_max, min_p,
                                      groups, cand_l, cand, best, vocab, taken, K=k, GROUP=GROUP,
                                      TAKEN=next_power_of_2(taken), num_warps=NUM_WARPS)
        _race_before_kernel[(n, num_chunks)](logits, logits.stride(0), temperature, row_max, flags, cand_l, cand, part,
                                             vocab, num_chunks, CHUNK=chunk,
                                             BLOCK=min(RACE_BLOCK, chunk, next_power_of_2(vocab)), K=k,
                                             num_warps=NUM_WARPS)
        _race_final_kernel[(n,)](part, target, flags, best, cand, token, found, num_chunks, K=k,
                                 BLOCK_C=next_power_of_2(num_chunks), num_warps=1)
    return token, found.view(torch.bool)
