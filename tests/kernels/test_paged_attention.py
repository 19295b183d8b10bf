"""Paged attention kernels vs the torch references, and vs dense causal SDPA on the same K/V unpaged.

CPU runs the Triton interpreter (float32/float16 and tiny odd shapes; the interpreter's bf16
tl.dot is broken, so bf16 runs on GPU only). Pools hold each request's pages in a random,
non-contiguous order; block-table rows are padded with the pad page.
"""

import pytest
import torch
import torch.nn.functional as F
import triton

from triton_kernels import paged_attention as pa
from triton_kernels import paged_decode as pd

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ATOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}
RTOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def make_case(*, prefix_lens, new_lens, page_size, hkv, group, d, dtype=torch.float32, seed=0,
              spare_pages=3):
    """Dense per-request K/V scattered into random pages, q as a strided view.
    Returns (kwargs for the extend kernels, dense [(k, v)] per request)."""
    g = torch.Generator().manual_seed(seed)
    hq = hkv * group
    lens = [p + n for p, n in zip(prefix_lens, new_lens)]
    pages_per = [-(-n // page_size) for n in lens]
    num_pages = sum(pages_per) + spare_pages
    pad_page = num_pages
    order = torch.randperm(num_pages, generator=g)
    block_table = torch.full((len(lens), max(pages_per) + 2), pad_page, dtype=torch.int32)
    k_cache = torch.randn(num_pages + 1, page_size, hkv, d, generator=g).to(dtype)
    v_cache = torch.randn(num_pages + 1, page_size, hkv, d, generator=g).to(dtype)
    dense, used = [], 0
    for b, n in enumerate(lens):
        pages = order[used:used + pages_per[b]]
        used += pages_per[b]
        block_table[b, :len(pages)] = pages.int()
        k = torch.randn(n, hkv, d, generator=g).to(dtype)
        v = torch.randn(n, hkv, d, generator=g).to(dtype)
        pos = torch.arange(n)
        k_cache[pages[pos // page_size].long(), pos % page_size] = k
        v_cache[pages[pos // page_size].long(), pos % page_size] = v
        dense.append((k, v))
    t = sum(new_lens)
    q = torch.randn(t, hq, 2 * d, generator=g).to(dtype)[..., :d]  # strided heads, like q of [q | gate]
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(new_lens).cumsum(0)
    kwargs = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_table=block_table, cu_seqlens_q=cu,
                  seq_lens=torch.tensor(lens, dtype=torch.int32), scale=d**-0.5)
    to = lambda x: x.to(DEVICE) if isinstance(x, torch.Tensor) else x  # noqa: E731
    return {k: to(v) for k, v in kwargs.items()}, [(to(k), to(v)) for k, v in dense]


def dense_causal(q, dense, new_lens, scale):
    """Oracle on unpaged K/V: SDPA per request with the causal edge at the bottom right."""
    outs, start = [], 0
    for (k, v), n in zip(dense, new_lens):
        if n == 0:
            continue
        qi = q[start:start + n].float().transpose(0, 1)[None]  # [1, Hq, n, D]
        ki, vi = k.float().transpose(0, 1)[None], v.float().transpose(0, 1)[None]  # [1, Hkv, L, D]
        keep = torch.ones(n, k.shape[0], dtype=torch.bool, device=q.device).tril(k.shape[0] - n)
        o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=keep, scale=scale, enable_gqa=True)
        outs.append(o[0].transpose(0, 1))
        start += n
    return torch.cat(outs).to(q.dtype)


def check(out, ref, dtype):
    assert out.shape == ref.shape and out.dtype == ref.dtype
    torch.testing.assert_close(out.float(), ref.float(), atol=ATOL[dtype], rtol=RTOL[dtype])


# (page_size, hkv, group, d): page sizes 1/4/16, GQA 1/2/4, head_dim 16/24/32
SHAPES = [(1, 2, 2, 16), (4, 1, 4, 24), (16, 2, 1, 32), (4, 2, 2, 24), (16, 1, 4, 16)]


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_store_kv(page_size):
    hkv, d, t = 3, 24, 11
    g = torch.Generator().manual_seed(page_size)
    num_pages = 40 // page_size + 2
    kc = torch.randn(num_pages + 1, page_size, hkv, d, generator=g).to(DEVICE)
    vc = torch.randn_like(kc)
    kv = torch.randn(t, 2, hkv, d + 5, generator=g).to(DEVICE)  # strided views of a fused projection
    k, v = kv[:, 0, :, :d], kv[:, 1, :, 1:d + 1]
    pad = num_pages * page_size  # padded rows write into the pad page
    pads = sorted({pad, pad + page_size - 1})  # distinct: two rows writing one slot would race
    slots = torch.randperm(num_pages * page_size, generator=g)[:t - len(pads)].tolist() + pads
    slot_mapping = torch.tensor(slots, dtype=torch.int64, device=DEVICE)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    pa.store_kv(k=k, v=v, k_cache=kc, v_cache=vc, slot_mapping=slot_mapping)
    pa.store_kv_ref(k=k, v=v, k_cache=kc_ref, v_cache=vc_ref, slot_mapping=slot_mapping)
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)

    skipped = slot_mapping.clone()
    skipped[::2] = -1  # negative slots are skipped
    before = kc.clone()
    pa.store_kv(k=k * 2, v=v * 2, k_cache=kc, v_cache=vc, slot_mapping=skipped)
    kept = skipped >= 0
    pa.store_kv_ref(k=k[kept] * 2, v=v[kept] * 2, k_cache=before, v_cache=vc_ref, slot_mapping=skipped[kept])
    assert torch.equal(kc, before) and torch.equal(vc, vc_ref)


@pytest.mark.parametrize("page_size,hkv,group,d", SHAPES)
def test_extend_matches_ref_and_dense(page_size, hkv, group, d):
    prefix_lens, new_lens = [5, 0, 9, 3], [3, 20, 1, 0]  # prefixes off page edges; one empty request
    kw, dense = make_case(prefix_lens=prefix_lens, new_lens=new_lens, page_size=page_size, hkv=hkv,
                          group=group, d=d, seed=page_size * 7 + d)
    out = pa.paged_attention_extend(**kw)
    check(out, pa.paged_attention_extend_ref(**kw), torch.float32)
    check(out, dense_causal(kw["q"], dense, new_lens, kw["scale"]), torch.float32)


@pytest.mark.parametrize("page_size,hkv,group,d", SHAPES[:3])
@pytest.mark.parametrize("scores_per_group", [pa.SCORES_PER_GROUP, 1])
def test_short_rows_reference_matches_dense(page_size, hkv, group, d, scores_per_group, monkeypatch):
    """The torch reference's batched path (rows of at most SHORT_ROWS new tokens: decode and verify steps),
    in one group or one row a group, against SDPA per request: ragged rows, an empty one, a fresh one."""
    monkeypatch.setattr(pa, "SCORES_PER_GROUP", scores_per_group)
    prefix_lens, new_lens = [5, 0, 30, 3, 11], [4, 8, 1, 0, 2]
    kw, dense = make_case(prefix_lens=prefix_lens, new_lens=new_lens, page_size=page_size, hkv=hkv,
                          group=group, d=d, seed=page_size * 5 + d)
    check(pa.paged_attention_extend_ref(**kw), dense_causal(kw["q"], dense, new_lens, kw["scale"]), torch.float32)


@pytest.mark.parametrize("block_m,block_n", [(32, 16), (16, 32)])
def test_extend_other_tiles(block_m, block_n):
    """Diagonal bookkeeping when BLOCK_M != BLOCK_N (the GPU configs use 128/64 and 64/64)."""
    new_lens = [37, 2, 18]
    kw, dense = make_case(prefix_lens=[11, 40, 0], new_lens=new_lens, page_size=4, hkv=2, group=2, d=16, seed=3)
    cfg = dict(BLOCK_M=block_m, BLOCK_N=block_n, num_warps=4, num_stages=1)
    out = pa._paged_attention_extend(**kw, config=cfg)
    check(out, dense_causal(kw["q"], dense, new_lens, kw["scale"]), torch.float32)


def test_extend_float16():
    kw, _ = make_case(prefix_lens=[6, 13], new_lens=[10, 4], page_size=4, hkv=2, group=2, d=32,
                      dtype=torch.float16, seed=5)
    check(pa.paged_attention_extend(**kw), pa.paged_attention_extend_ref(**kw), torch.float16)


def decode_kwargs(kw):
    return {k: v for k, v in kw.items() if k != "cu_seqlens_q"}


@pytest.mark.parametrize("page_size,hkv,group,d", SHAPES)
def test_decode_matches_ref_and_dense(page_size, hkv, group, d):
    prefix_lens = [40, 0, 17, 3, 64]
    kw, dense = make_case(prefix_lens=prefix_lens, new_lens=[1] * 5, page_size=page_size, hkv=hkv,
                          group=group, d=d, seed=page_size + d)
    out = pd.paged_attention_decode(**decode_kwargs(kw))
    check(out, pd.paged_attention_decode_ref(**decode_kwargs(kw)), torch.float32)
    check(out, dense_causal(kw["q"], dense, [1] * 5, kw["scale"]), torch.float32)


@pytest.mark.parametrize("splits", [1, 3, 20])
def test_decode_splits(splits):
    """Split-K partials merge exactly, including more valid splits than one reduce step holds (16),
    splits left empty by short requests, and padding rows (seq_len 0 gives zeros)."""
    kw, _ = make_case(prefix_lens=[299, 4, 31], new_lens=[1, 1, 1], page_size=4, hkv=1, group=4, d=16, seed=splits)
    kw = decode_kwargs(kw)
    cfg = dict(BLOCK_N=16, NUM_SPLITS=splits, num_warps=4, num_stages=1)
    check(pd._paged_attention_decode(**kw, config=cfg), pd.paged_attention_decode_ref(**kw), torch.float32)

    padded = dict(kw, seq_lens=torch.tensor([300, 0, 33], dtype=torch.int32, device=DEVICE))
    out = pd._paged_attention_decode(**padded, config=cfg)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    keep = [0, 2]
    ref = pd.paged_attention_decode_ref(**dict(kw, q=kw["q"][keep], block_table=kw["block_table"][keep],
                                                seq_lens=padded["seq_lens"][keep]))
    check(out[keep], ref, torch.float32)


def test_decode_split_reduce_head_dim_blocks():
    """The reduce merges head_dim in 64-column blocks: head_dim 80 takes a full and a masked one."""
    kw, _ = make_case(prefix_lens=[70, 9], new_lens=[1, 1], page_size=4, hkv=2, group=2, d=80, seed=17)
    kw = decode_kwargs(kw)
    cfg = dict(BLOCK_N=16, NUM_SPLITS=5, num_warps=4, num_stages=1)
    check(pd._paged_attention_decode(**kw, config=cfg), pd.paged_attention_decode_ref(**kw), torch.float32)


def test_decode_wide_table_many_empty_splits():
    """A block table far wider than the sequences (a CUDA graph's full-width table): the default
    config splits by the grid, most splits hold no tokens, the output is unchanged."""
    kw, _ = make_case(prefix_lens=[37, 0], new_lens=[1, 1], page_size=4, hkv=1, group=4, d=16, seed=13)
    kw = decode_kwargs(kw)
    bt = kw["block_table"]
    wide = torch.cat([bt, bt[:, -1:].expand(-1, 254)], dim=1)  # padded with the pad page
    cfg = pd._decode_config(2, 1, 16, wide.shape[1] * 4, torch.float32, torch.device(DEVICE))
    assert cfg["NUM_SPLITS"] * 2 > triton.cdiv(38, cfg["BLOCK_N"])  # some splits are empty
    check(pd.paged_attention_decode(**dict(kw, block_table=wide)), pd.paged_attention_decode_ref(**kw),
          torch.float32)


H200_SMS = 132


@pytest.mark.parametrize("batch,length,expected", [
    (1, 32768, (64, 66, 8, 2)),  # ANCHORS decode shapes: the best configs of the H200 sweeps
    (64, 4096, (64, 1, 4, 2)),
    (256, 1024, (32, 1, 4, 2)),
])
def test_decode_config_at_measured_shapes(monkeypatch, batch, length, expected):
    monkeypatch.setattr(pd, "_num_sms", lambda device: H200_SMS)
    cuda = torch.device("cuda")
    for width in (length, 262144):  # the tight table and a CUDA graph's full-width one
        cfg = pd._decode_config(batch, 4, 256, width, torch.bfloat16, cuda)
        assert (cfg["BLOCK_N"], cfg["NUM_SPLITS"], cfg["num_warps"], cfg["num_stages"]) == expected, width


def test_decode_config_bounded_by_sms(monkeypatch):
    """Splits come from batch x kv heads vs the SMs: never more than 2 programs per SM once split,
    none once the unsplit grid fills the GPU, whatever the table width."""
    monkeypatch.setattr(pd, "_num_sms", lambda device: H200_SMS)
    cuda = torch.device("cuda")
    for hkv, d, dtype in [(4, 256, torch.bfloat16), (8, 128, torch.float16), (1, 64, torch.bfloat16),
                          (2, 96, torch.float32)]:
        for batch in [1, 2, 3, 7, 16, 33, 64, 100, 256, 1024]:
            programs = batch * hkv
            for width in (16, 1024, 32768, 262144):
                cfg = pd._decode_config(batch, hkv, d, width, dtype, cuda)
                splits = cfg["NUM_SPLITS"]
                assert splits >= 1 and (splits == 1 or programs * splits <= 2 * H200_SMS)
                assert splits == 1 or splits * 4 * cfg["BLOCK_N"] <= width + 4 * cfg["BLOCK_N"]
                if programs > H200_SMS:
                    assert splits == 1
            wide = pd._decode_config(batch, hkv, d, 262144, dtype, cuda)
            assert wide["NUM_SPLITS"] == max(1, 2 * H200_SMS // programs)  # the table width does not add splits


@pytest.mark.parametrize("prefix,new,expected", [
    (0, 4096, (128, 64, 8, 3)),  # ANCHORS prefill / extend shapes: the best configs of the H200 sweeps
    (4096, 512, (64, 64, 4, 2)),
    (0, 32768, (128, 64, 8, 3)),
])
def test_extend_config_at_measured_shapes(monkeypatch, prefix, new, expected):
    monkeypatch.setattr(pa, "_num_sms", lambda device: H200_SMS)
    cfg = pa._extend_config(new, 16, 256, torch.bfloat16, torch.device("cuda"))
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"]) == expected


def test_decode_float16():
    kw, _ = make_case(prefix_lens=[50, 7], new_lens=[1, 1], page_size=16, hkv=2, group=2, d=24,
                      dtype=torch.float16, seed=9)
    kw = decode_kwargs(kw)
    check(pd.paged_attention_decode(**kw), pd.paged_attention_decode_ref(**kw), torch.float16)


def test_chunked_prefill_then_decode():
    """Serving invariant: a prompt stored and attended in two chunks == one chunk, and the decode
    step after it == the last row of one extend over all T+1 tokens."""
    page_size, hkv, group, d, n = 4, 2, 2, 16, 23
    kw, _ = make_case(prefix_lens=[0], new_lens=[n + 1], page_size=page_size, hkv=hkv, group=group, d=d, seed=11)
    full = pa.paged_attention_extend(**kw)
    whole = pa.paged_attention_extend(**dict(kw, q=kw["q"][:n], seq_lens=kw["seq_lens"] - 1,
                                             cu_seqlens_q=torch.tensor([0, n], dtype=torch.int32, device=DEVICE)))
    parts = []
    for lo, hi in [(0, 10), (10, n)]:
        cu = torch.tensor([0, hi - lo], dtype=torch.int32, device=DEVICE)
        seq = torch.tensor([hi], dtype=torch.int32, device=DEVICE)
        parts.append(pa.paged_attention_extend(**dict(kw, q=kw["q"][lo:hi], cu_seqlens_q=cu, seq_lens=seq)))
    check(torch.cat(parts), whole, torch.float32)
    check(whole, full[:n], torch.float32)
    step = pd.paged_attention_decode(**dict(decode_kwargs(kw), q=kw["q"][n:]))
    check(step, full[n:], torch.float32)


# ----------------------------------------------------------------------------- GPU, real shapes


@pytest.mark.gpu
@pytest.mark.parametrize("page_size", [16, 64])
def test_gpu_extend_real_shapes(page_size):
    new_lens = [700, 1, 300, 129]
    kw, dense = make_case(prefix_lens=[0, 513, 1000, 4097], new_lens=new_lens, page_size=page_size, hkv=4,
                          group=4, d=256, dtype=torch.bfloat16, seed=1)
    out = pa.paged_attention_extend(**kw)
    check(out, pa.paged_attention_extend_ref(**kw), torch.bfloat16)
    check(out, dense_causal(kw["q"], dense, new_lens, kw["scale"]), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("batch,length", [(1, 32768), (5, 3001), (64, 700)])
def test_gpu_decode_real_shapes(batch, length):
    prefix = [length - 1 - 7 * i for i in range(batch)]
    kw, _ = make_case(prefix_lens=prefix, new_lens=[1] * batch, page_size=16, hkv=4, group=4, d=256,
                      dtype=torch.bfloat16, seed=batch)
    kw = decode_kwargs(kw)
    check(pd.paged_attention_decode(**kw), pd.paged_attention_decode_ref(**kw), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("d", [80, 96, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_head_dims_and_dtypes(d, dtype):
    new_lens = [200, 1, 77]
    kw, _ = make_case(prefix_lens=[0, 300, 45], new_lens=new_lens, page_size=16, hkv=2, group=4, d=d,
                      dtype=dtype, seed=d)
    check(pa.paged_attention_extend(**kw), pa.paged_attention_extend_ref(**kw), dtype)
    kw, _ = make_case(prefix_lens=[0, 300, 4000], new_lens=[1, 1, 1], page_size=16, hkv=2, group=4, d=d,
                      dtype=dtype, seed=d)
    kw = decode_kwargs(kw)
    check(pd.paged_attention_decode(**kw), pd.paged_attention_decode_ref(**kw), dtype)
