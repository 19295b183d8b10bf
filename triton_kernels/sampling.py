"""The two vocabulary-wide passes of sampling (runner/sampler.py), in logit space and without a sort.

row_stats:  per row, m = max(logits / T) and the mass sum(exp(logits / T - m)), in one read.
draw_kept:  per row, the exponential race argmax_i w_i / E_i over the kept tokens, w_i = exp(l_i / T - m):
            kept = (l > bound) or (l == bound and among the first `need` such tokens by id), and w_i >= min_p
            (min-p relative to the largest probability, whose w is 1). Ties of the race go to the lower id.

The sampler finds (bound, need) from the top-k / top-p candidates; these kernels then read the
logits once each and the noise once, where the torch path writes and reads [n, V] masks several times
(among them an integer scan over the vocabulary for the ties at the boundary). One program per row
walks the row in blocks, so the tie count carries from block to block in a register.
"""

import torch
import triton
import triton.language as tl

BLOCK = 4096  # vocabulary entries per loop step
NUM_WARPS = 8


def row_stats_ref(*, logits: torch.Tensor, temperature: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [n, V] float32; temperature: [n] float32 (> 0). Returns (m [n], mass [n]) float32:
    m = max(logits / T), mass = sum(exp(logits / T - m))."""
    scaled = logits / temperature[:, None]
    m = scaled.amax(dim=-1)
    return m, torch.exp(scaled - m[:, None]).sum(dim=-1)


def draw_kept_ref(*, logits: torch.Tensor, noise: torch.Tensor, temperature: torch.Tensor, row_max: torch.Tensor,
                  bound: torch.Tensor, need: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """logits, noise: [n, V] float32 (noise > 0, Exp(1)); temperature, row_max, bound, min_p: [n] float32;
    need: [n] int64. Returns the drawn token ids [n] int64."""
    w = torch.exp(logits / temperature[:, None] - row_max[:, None])
    tie = logits == bound[:, None]
    keep = (logits > bound[:, None]) | (tie & (tie.cumsum(dim=-1) <= need[:, None]))
    keep &= w >= min_p[:, None]
    return torch.where(keep, w / noise, -1.0).argmax(dim=-1)


@triton.jit
def _row_stats_kernel(l_ptr, l_stride, t_ptr, m_ptr, mass_ptr, vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(t_ptr + row)
    o = tl.arange(0, BLOCK)
    m_lane = tl.full([BLOCK], float("-inf"), tl.float32)  # per-lane running max and mass
    s_lane = tl.zeros([BLOCK], tl.float32)
    for start in range(0, vocab, BLOCK):
        x = tl.load(l_ptr + row * l_stride + start + o, mask=start + o < vocab, other=float("-inf"))
        x = x / t
        m_new = tl.maximum(m_lane, x)
        m_ref = tl.where(m_new > float("-inf"), m_new, 0.0)  # a lane without a finite value yet stays at 0
        s_lane = s_lane * tl.exp(m_lane - m_ref) + tl.exp(x - m_ref)
        m_lane = m_new
    m = tl.max(m_lane, 0)
    mass = tl.sum(s_lane * tl.exp(m_lane - m), 0)
    tl.store(m_ptr + row, m)
    tl.store(mass_ptr + row, mass)


def row_stats(*, logits: torch.Tensor, temperature: torch.Tensor,
              block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Same as row_stats_ref: the same max, and the mass up to summation order."""
    n, vocab = logits.shape
    assert logits.dtype == torch.float32 and logits.stride(1) == 1, (logits.dtype, logits.stride())
    temperature = temperature.reshape(-1).float().contiguous()
    m = torch.empty(n, dtype=torch.float32, device=logits.device)
    mass = torch.empty_like(m)
    block = min(block, triton.next_power_of_2(vocab))
    if n:
        _row_stats_kernel[(n,)](logits, logits.stride(0), temperature, m, mass, vocab, BLOCK=block,
                                num_warps=NUM_WARPS)
    return m, mass


@triton.jit
def _draw_kept_kernel(l_ptr, l_stride, e_ptr, e_stride, t_ptr, m_ptr, bound_ptr, need_ptr, min_p_ptr, out_ptr,
                      vocab, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(t_ptr + row)
    m = tl.load(m_ptr + row)
    bound = tl.load(bound_ptr + row)
    need = tl.load(need_ptr + row).to(tl.int32)
    min_p = tl.load(min_p_ptr + row)
    o = tl.arange(0, BLOCK)
    best = tl.full([], -2.0, tl.float32)
    best_id = tl.full([], 0, tl.int64)
    ties = tl.full([], 0, tl.int32)  # tokens equal to bound in the blocks before
    for start in range(0, vocab, BLOCK):
        valid = start + o < vocab
        x = tl.load(l_ptr + row * l_stride + start + o, mask=valid, other=float("-inf"))
        e = tl.load(e_ptr + row * e_stride + start + o, mask=valid, other=1.0)
        w = tl.exp(x / t - m)
        tie = (x == bound) & valid
        rank = ties + tl.cumsum(tie.to(tl.int32), 0)  # 1-based rank among the ties, in id order
        keep = ((x > bound) | (tie & (rank <= need))) & (w >= min_p) & valid
        score = tl.where(keep, w / e, -1.0)
        block_best = tl.max(score, 0)
        take = block_best > best  # strictly: an earlier block keeps an equal score (lower id)
        best_id = tl.where(take, start + tl.argmax(score, 0).to(tl.int64), best_id)
        best = tl.where(take, block_best, best)
        ties += tl.sum(tie.to(tl.int32), 0)
    tl.store(out_ptr + row, best_id)


def draw_kept(*, logits: torch.Tensor, noise: torch.Tensor, temperature: torch.Tensor, row_max: torch.Tensor,
              bound: torch.Tensor, need: torch.Tensor, min_p: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Same as draw_kept_ref: the same token, up to a float near-tie of two tokens' w / E (exp may round
    differently from torch's)."""
    n, vocab = logits.shape
    assert logits.dtype == noise.dtype == torch.float32 and noise.shape == logits.shape, (logits.dtype, noise.dtype)
    assert logits.stride(1) == 1 and noise.stride(1) == 1
    flat = [t.reshape(-1).contiguous() for t in (temperature.float(), row_max.float(), bound.float(), need,
                                                 min_p.float())]
    out = torch.empty(n, dtype=torch.int64, device=logits.device)
    block = min(block, triton.next_power_of_2(vocab))
    if n:
        _draw_kept_kernel[(n,)](logits, logits.stride(0), noise, noise.stride(0), *flat, out, vocab, BLOCK=block,
                                num_warps=NUM_WARPS)
    return out
