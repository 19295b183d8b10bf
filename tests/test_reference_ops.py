"""The torch reference ops (the CPU backend) against the simplest possible oracles:
token-by-token recurrences and unpaged attention, on odd shapes."""

import pytest
import torch
import torch.nn.functional as F

from triton_kernels.causal_conv1d import causal_conv1d_prefill_ref, causal_conv1d_update_ref
from triton_kernels.fused_moe import fused_moe_ref
from triton_kernels.gdn_chunk import gdn_prefill_ref
from triton_kernels.gdn_recurrent import gdn_decode_ref
from triton_kernels.paged_attention import paged_attention_extend_ref, store_kv_ref
from triton_kernels.paged_decode import paged_attention_decode_ref

TOL = dict(rtol=1e-4, atol=1e-5)


def _cu(lens):
    return torch.tensor([0] + lens).cumsum(0).to(torch.int32)


# ---- GDN ---------------------------------------------------------------------------------------

def naive_gated_delta(q, k, v, a, b, A_log, dt_bias, state):
    """One sequence, one token at a time, straight from the definition. q, k: [L, Hk, K]; v: [L, Hv, V];
    state: [Hv, K, V]. Returns o [L, Hv, V], final state."""
    r = v.shape[1] // q.shape[1]
    out = []
    for t in range(q.shape[0]):
        qt = F.normalize(q[t].double(), dim=-1, eps=0).repeat_interleave(r, 0) * q.shape[-1] ** -0.5
        kt = F.normalize(k[t].double(), dim=-1, eps=0).repeat_interleave(r, 0)
        decay = torch.exp(-A_log.double().exp() * F.softplus(a[t].double() + dt_bias.double()))
        beta = torch.sigmoid(b[t].double())
        state = state * decay[:, None, None]
        err = v[t].double() - torch.einsum("hk,hkv->hv", kt, state)
        state = state + torch.einsum("hk,hv->hkv", kt, beta[:, None] * err)
        out.append(torch.einsum("hk,hkv->hv", qt, state))
    return torch.stack(out), state


def _gdn_inputs(T, Hk, Hv, K, V, seed=0):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(q=rnd(T, Hk, K), k=rnd(T, Hk, K), v=rnd(T, Hv, V), a=rnd(T, Hv), b=rnd(T, Hv),
                A_log=rnd(Hv) * 0.5, dt_bias=rnd(Hv) * 0.5)


@pytest.mark.parametrize("lens,Hk,Hv,K,V", [([1], 1, 1, 8, 8), ([5, 63, 64], 2, 4, 16, 8),
                                            ([65, 3, 130], 1, 3, 8, 16)])
def test_gdn_prefill_matches_naive_recurrence(lens, Hk, Hv, K, V):
    x = _gdn_inputs(sum(lens), Hk, Hv, K, V)
    slots = torch.tensor([3, 0, 5][: len(lens)], dtype=torch.int32)
    has_init = torch.tensor([i % 2 == 1 for i in range(len(lens))])
    pool = torch.randn(6, Hv, K, V)
    init = pool.clone()
    o = gdn_prefill_ref(**x, ssm_states=pool, cu_seqlens=_cu(lens), state_slots=slots, has_initial_state=has_init)
    cu = _cu(lens).tolist()
    for i, slot in enumerate(slots.tolist()):
        s, e = cu[i], cu[i + 1]
        start = init[slot].double() if has_init[i] else torch.zeros(Hv, K, V, dtype=torch.float64)
        ref_o, ref_state = naive_gated_delta(*(x[n][s:e] for n in "qkvab"), x["A_log"], x["dt_bias"], start)
        torch.testing.assert_close(o[s:e], ref_o.float(), **TOL)
        torch.testing.assert_close(pool[slot], ref_state.float(), **TOL)
    untouched = [i for i in range(6) if i not in slots.tolist()]
    assert torch.equal(pool[untouched], init[untouched])


def test_gdn_decode_steps_match_naive_and_skip_pad():
    Hk, Hv, K, V, B, pad = 2, 4, 8, 8, 3, 7
    pool = torch.randn(8, Hv, K, V)
    slots = torch.tensor([2, pad, 5], dtype=torch.int32)
    init = pool.clone()
    x = _gdn_inputs(B, Hk, Hv, K, V, seed=1)
    o = gdn_decode_ref(**x, ssm_states=pool, state_slots=slots, pad_slot=pad)
    for i, slot in enumerate(slots.tolist()):
        if slot == pad:
            assert torch.all(o[i] == 0)
            continue
        ref_o, ref_state = naive_gated_delta(*(x[n][i:i + 1] for n in "qkvab"), x["A_log"], x["dt_bias"],
                                             init[slot].double())
        torch.testing.assert_close(o[i], ref_o[0].float(), **TOL)
        torch.testing.assert_close(pool[slot], ref_state.float(), **TOL)
    assert torch.equal(pool[pad], init[pad])


def test_gdn_prefill_in_pieces_then_decode_equals_one_prefill():
    """The serving invariant: chunked prefill carried through the slot, then a decode step."""
    Hk, Hv, K, V, T = 2, 4, 16, 8, 77
    x = _gdn_inputs(T + 1, Hk, Hv, K, V, seed=2)
    one = torch.zeros(2, Hv, K, V)
    o_one = gdn_prefill_ref(**{n: t[:T + 1] for n, t in x.items() if t.dim() > 1}, A_log=x["A_log"],
                            dt_bias=x["dt_bias"], ssm_states=one, cu_seqlens=_cu([T + 1]),
                            state_slots=torch.tensor([1]), has_initial_state=torch.tensor([False]))
    pieces = torch.zeros(2, Hv, K, V)
    outs, start = [], 0
    for n in (7, 64, 6):
        part = {k: t[start:start + n] for k, t in x.items() if t.dim() > 1}
        outs.append(gdn_prefill_ref(**part, A_log=x["A_log"], dt_bias=x["dt_bias"], ssm_states=pieces,
                                    cu_seqlens=_cu([n]), state_slots=torch.tensor([1]),
                                    has_initial_state=torch.tensor([start > 0])))
        start += n
    last = {k: t[T:T + 1] for k, t in x.items() if t.dim() > 1}
    outs.append(gdn_decode_ref(**last, A_log=x["A_log"], dt_bias=x["dt_bias"], ssm_states=pieces,
                               state_slots=torch.tensor([1])))
    torch.testing.assert_close(torch.cat(outs), o_one, **TOL)
    torch.testing.assert_close(pieces[1], one[1], **TOL)


# ---- causal conv1d -----------------------------------------------------------------------------

@pytest.mark.parametrize("width", [2, 4])
def test_conv1d_prefill_matches_token_by_token_updates(width):
    D, lens = 6, [1, 2, 9]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(sum(lens), D, generator=g)
    weight, bias = torch.randn(D, width, generator=g), torch.randn(D, generator=g)
    pool = torch.randn(4, width - 1, D, generator=g)
    step_pool = pool.clone()
    slots = torch.tensor([2, 0, 3], dtype=torch.int32)
    has_init = torch.tensor([True, False, True])
    y = causal_conv1d_prefill_ref(x=x, weight=weight, bias=bias, conv_states=pool, cu_seqlens=_cu(lens),
                                  state_slots=slots, has_initial_state=has_init)
    cu = _cu(lens).tolist()
    for i, slot in enumerate(slots.tolist()):
        if not has_init[i]:
            step_pool[slot] = 0
        for t in range(cu[i], cu[i + 1]):
            y_t = causal_conv1d_update_ref(x=x[t:t + 1], weight=weight, bias=bias, conv_states=step_pool,
                                           state_slots=slots[i:i + 1])
            torch.testing.assert_close(y[t:t + 1], y_t, **TOL)
    torch.testing.assert_close(pool, step_pool, **TOL)


def test_conv1d_matches_torch_conv():
    D, W, L = 5, 4, 11
    x, weight = torch.randn(L, D), torch.randn(D, W)
    pool = torch.zeros(1, W - 1, D)
    y = causal_conv1d_prefill_ref(x=x, weight=weight, bias=None, conv_states=pool, cu_seqlens=_cu([L]),
                                  state_slots=torch.tensor([0]), has_initial_state=torch.tensor([False]),
                                  activation=None)
    ref = F.conv1d(x.t()[None], weight[:, None], padding=W - 1, groups=D)[0, :, :L].t()
    torch.testing.assert_close(y, ref, **TOL)
    torch.testing.assert_close(pool[0], x[-(W - 1):], **TOL)


# ---- paged attention ---------------------------------------------------------------------------

def _dense_causal(q, k, v, prefix, scale):
    """q: [Lq, Hq, D] at positions prefix..; k, v: [Lk, Hkv, D]. torch SDPA as the oracle."""
    r = q.shape[1] // k.shape[1]
    mask = torch.arange(k.shape[0])[None, :] <= torch.arange(q.shape[0])[:, None] + prefix
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.repeat_interleave(r, 1).transpose(0, 1),
                                       v.repeat_interleave(r, 1).transpose(0, 1), attn_mask=mask, scale=scale)
    return o.transpose(0, 1)


@pytest.mark.parametrize("page_size,Hq,Hkv,D", [(1, 2, 2, 8), (4, 4, 2, 12), (16, 6, 2, 16)])
def test_paged_extend_and_decode_match_dense(page_size, Hq, Hkv, D):
    g = torch.Generator().manual_seed(3)
    prefixes, news = [0, 5, 17], [7, 1, 4]
    num_pages = 70
    k_cache = torch.zeros(num_pages + 1, page_size, Hkv, D)
    v_cache = torch.zeros_like(k_cache)
    perm = torch.randperm(num_pages, generator=g)
    max_pages = -(-max(p + n + 1 for p, n in zip(prefixes, news)) // page_size)
    block_table = perm[: 3 * max_pages].view(3, max_pages).to(torch.int32)
    full_k = [torch.randn(p + n + 1, Hkv, D, generator=g) for p, n in zip(prefixes, news)]
    full_v = [torch.randn(p + n + 1, Hkv, D, generator=g) for p, n in zip(prefixes, news)]

    def slots_of(i, positions):
        pos = torch.tensor(positions, dtype=torch.long)
        return block_table[i, pos // page_size].long() * page_size + pos % page_size

    for i, p in enumerate(prefixes):  # the cached prefix
        store_kv_ref(k=full_k[i][:p], v=full_v[i][:p], k_cache=k_cache, v_cache=v_cache,
                     slot_mapping=slots_of(i, list(range(p))))
    q = torch.randn(sum(news), Hq, D, generator=g)
    slot_mapping = torch.cat([slots_of(i, list(range(p, p + n))) for i, (p, n) in enumerate(zip(prefixes, news))])
    store_kv_ref(k=torch.cat([full_k[i][p:p + n] for i, (p, n) in enumerate(zip(prefixes, news))]),
                 v=torch.cat([full_v[i][p:p + n] for i, (p, n) in enumerate(zip(prefixes, news))]),
                 k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    seq_lens = torch.tensor([p + n for p, n in zip(prefixes, news)], dtype=torch.int32)
    o = paged_attention_extend_ref(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                                   cu_seqlens_q=_cu(news), seq_lens=seq_lens, scale=D**-0.5)
    cu = _cu(news).tolist()
    for i, (p, n) in enumerate(zip(prefixes, news)):
        ref = _dense_causal(q[cu[i]:cu[i + 1]], full_k[i][:p + n], full_v[i][:p + n], p, D**-0.5)
        torch.testing.assert_close(o[cu[i]:cu[i + 1]], ref, **TOL)
    # one decode step for every request
    store_kv_ref(k=torch.stack([fk[-1] for fk in full_k]), v=torch.stack([fv[-1] for fv in full_v]),
                 k_cache=k_cache, v_cache=v_cache,
                 slot_mapping=torch.cat([slots_of(i, [p + n]) for i, (p, n) in enumerate(zip(prefixes, news))]))
    qd = torch.randn(3, Hq, D, generator=g)
    od = paged_attention_decode_ref(q=qd, k_cache=k_cache, v_cache=v_cache, block_table=block_table,
                                    seq_lens=seq_lens + 1, scale=D**-0.5)
    for i in range(3):
        ref = _dense_causal(qd[i:i + 1], full_k[i], full_v[i], full_k[i].shape[0] - 1, D**-0.5)
        torch.testing.assert_close(od[i:i + 1], ref, **TOL)


# ---- MoE ---------------------------------------------------------------------------------------

def test_fused_moe_matches_per_token_loop():
    g = torch.Generator().manual_seed(4)
    T, H, I, E, k = 9, 8, 6, 5, 2
    x = torch.randn(T, H, generator=g)
    w13, w2 = torch.randn(E, 2 * I, H, generator=g), torch.randn(E, H, I, generator=g)
    weights = torch.rand(T, k, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    out = fused_moe_ref(x=x, w13=w13, w2=w2, topk_weights=weights, topk_ids=ids)
    for t in range(T):
        ref = torch.zeros(H)
        for j in range(k):
            e = ids[t, j]
            h = F.silu(w13[e, :I] @ x[t]) * (w13[e, I:] @ x[t])
            ref += weights[t, j] * (w2[e] @ h)
        torch.testing.assert_close(out[t], ref, rtol=1e-4, atol=1e-4)
