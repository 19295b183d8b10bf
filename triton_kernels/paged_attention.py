"""Paged attention over a KV pool laid out as vLLM's: `[num_pages, page_size, num_kv_heads, head_dim]`.

A request's KV lives in the pages listed by its row of `block_table` (`[B, max_pages]`);
token position p is at page `block_table[b, p // page_size]`, offset `p % page_size`.
`slot_mapping` gives the flat index `page * page_size + offset` where each new token's K/V go.
"""

import torch


def store_kv_ref(
    *,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """k, v: [T, Hkv, D]; k_cache, v_cache: [P, page_size, Hkv, D]; slot_mapping: [T]."""
    k_cache.view(-1, *k_cache.shape[2:])[slot_mapping] = k.to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slot_mapping] = v.to(v_cache.dtype)


def _gather_kv(cache: torch.Tensor, pages: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one request: [length, Hkv, D]."""
    return cache[pages].flatten(0, 1)[:length]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, prefix: int) -> torch.Tensor:
    """q: [Lq, Hq, D] at positions prefix..prefix+Lq-1; k, v: [Lk, Hkv, D]. Causal. fp32 math."""
    n_rep = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(n_rep, dim=1)
    v = v.float().repeat_interleave(n_rep, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) * scale
    q_pos = torch.arange(q.shape[0], device=q.device)[:, None] + prefix
    k_pos = torch.arange(k.shape[0], device=q.device)[None, :]
    scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)


def paged_attention_extend_ref(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """New tokens attend to their cached prefix plus themselves (causal). The new tokens' K/V
    must already be stored. q: [T, Hq, D] packed; cu_seqlens_q: [B+1]; seq_lens: [B] total
    tokens per request (prefix + new). Returns o: [T, Hq, D]."""
    o = torch.empty_like(q)
    bounds, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    for i, total in enumerate(lens):
        s, e = bounds[i], bounds[i + 1]
        k = _gather_kv(k_cache, block_table[i], total)
        v = _gather_kv(v_cache, block_table[i], total)
        o[s:e] = _attend(q[s:e], k, v, scale, total - (e - s)).to(q.dtype)
    return o


def paged_attention_decode_ref(
    *,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query token per request, at position seq_lens - 1. q: [B, Hq, D]. Returns [B, Hq, D]."""
    cu = torch.arange(q.shape[0] + 1, device=q.device)
    return paged_attention_extend_ref(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                                      cu_seqlens_q=cu, seq_lens=seq_lens, scale=scale)
