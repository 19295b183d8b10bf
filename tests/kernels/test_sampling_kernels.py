"""The sampling kernels (sampling.py, top_p.py) against their torch references (interpreter on CPU), on rows that span
several chunks (programs) and several blocks within a chunk, with ties that cross chunk and block
edges, -inf (grammar-masked) logits, and min-p."""

import pytest
import torch

from triton_kernels.sampling import (
    GROUP,
    draw_kept,
    draw_kept_ref,
    row_stats,
    row_stats_ref,
    top_logits,
)
from triton_kernels.top_p import top_p_bound, top_p_bound_ref, top_p_race, top_p_race_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CHUNK = 64  # small chunks: several programs per row on the interpreter's small vocabularies


def tied_logits(n: int, vocab: int, seed: int) -> torch.Tensor:
    """[n, V] logits from a few distinct values (many ties), some -inf."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(-4, 3, (n, vocab), generator=gen).float() * 0.5
    logits[torch.rand(n, vocab, generator=gen) < 0.1] = float("-inf")
    logits[:, 0] = 1.0  # a finite value in every row
    return logits.to(DEVICE)


@pytest.mark.parametrize("vocab", [1, 63, 64, 300])
def test_row_stats_match_ref(vocab):
    logits = torch.randn(5, vocab, generator=torch.Generator().manual_seed(vocab)).to(DEVICE) * 4
    logits[1, : vocab // 2] = float("-inf")  # a row with a masked head, and lanes that stay -inf
    temperature = torch.tensor([0.7, 1.0, 1.3, 0.05, 2.0], device=DEVICE)
    m, mass = row_stats(logits=logits, temperature=temperature, chunk=CHUNK)
    ref_m, ref_mass = row_stats_ref(logits=logits, temperature=temperature)
    assert torch.equal(m, ref_m)
    torch.testing.assert_close(mass, ref_mass, rtol=1e-5, atol=0)


def test_row_stats_at_the_default_chunk():  # two chunks of several blocks
    logits = torch.randn(3, 9000, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    temperature = torch.tensor([0.5, 1.0, 3.0], device=DEVICE)
    m, mass = row_stats(logits=logits, temperature=temperature)
    ref_m, ref_mass = row_stats_ref(logits=logits, temperature=temperature)
    assert torch.equal(m, ref_m)
    torch.testing.assert_close(mass, ref_mass, rtol=1e-5, atol=0)


@pytest.mark.parametrize("vocab,chunk", [(300, CHUNK), (1000, CHUNK), (2500, 2048), (16, CHUNK)])
def test_group_maxima_match_ref(vocab, chunk):
    """Partial last groups, masked (-inf) logits, chunks of one and of several blocks."""
    logits = tied_logits(4, vocab, seed=vocab)
    logits[2] = torch.randn(vocab, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    temperature = torch.tensor([0.7, 1.0, 1.3, 2.0], device=DEVICE)
    groups, ref_groups = (torch.full((4, -(-vocab // GROUP)), 7.0, device=DEVICE) for _ in range(2))
    m, _ = row_stats(logits=logits, temperature=temperature, group_max=groups, chunk=chunk)
    ref_m, _ = row_stats_ref(logits=logits, temperature=temperature, group_max=ref_groups)
    assert torch.equal(m, ref_m)
    assert torch.equal(groups, ref_groups)


@pytest.mark.parametrize("vocab,k", [(300, 1), (300, 18), (1000, 7), (1000, 50), (4000, 64)])
def test_top_logits_are_torch_topk_values(vocab, k):
    """Many ties (the k-th value shared by several groups, some of them not selected), -inf, random rows."""
    logits = tied_logits(4, vocab, seed=vocab + k)
    logits[3] = torch.randn(vocab, generator=torch.Generator().manual_seed(k)).bfloat16().float().to(DEVICE)
    groups = torch.empty(4, -(-vocab // GROUP), device=DEVICE)
    row_stats_ref(logits=logits, temperature=torch.ones(4, device=DEVICE), group_max=groups)
    assert torch.equal(top_logits(logits=logits, group_max=groups, k=k), logits.topk(k, dim=-1).values)


@pytest.mark.parametrize("seed,vocab,chunk", [(0, 200, CHUNK), (1, 200, CHUNK), (2, 300, CHUNK), (3, 200, 8192),
                                              (4, 2500, 2048), (5, 2500, 2048)])
def test_draw_matches_ref_with_ties_across_chunks_and_blocks(seed, vocab, chunk):
    n = 6
    logits = tied_logits(n, vocab, seed)
    gen = torch.Generator().manual_seed(100 + seed)
    temperature = torch.tensor([0.7, 1.0, 1.5, 0.3, 1.0, 2.0], device=DEVICE)
    row_max, _ = row_stats_ref(logits=logits, temperature=temperature)
    # bound: a value present in the row (ties at it); need: any count of them, up to all; one row keeps all
    values = logits.cpu()
    bound = torch.stack([values[i][torch.randint(vocab, (1,), generator=gen)] for i in range(n)]).view(n)
    ties = (values == bound[:, None]).sum(-1)
    need = torch.stack([torch.randint(int(t) + 1, (1,), generator=gen) for t in ties]).view(n)
    bound[2], need[2] = float("-inf"), 0
    min_p = torch.tensor([0.0, 0.1, 0.0, 0.5, 0.0, 0.02])
    noise = torch.empty(n, vocab).exponential_(generator=gen)
    args = dict(logits=logits, noise=noise.to(DEVICE), temperature=temperature, row_max=row_max,
                bound=bound.to(DEVICE), need=need.to(DEVICE), min_p=min_p.to(DEVICE))
    ids = draw_kept(**args, chunk=chunk)
    assert ids.dtype == torch.int64
    assert torch.equal(ids, draw_kept_ref(**args))
    if seed == 0:  # without top-k / top-p rows (every bound -inf) the kernel may skip the tie count
        args.update(bound=torch.full((n,), float("-inf"), device=DEVICE), need=torch.zeros_like(args["need"]))
        assert torch.equal(draw_kept(**args, chunk=chunk, ties=False), draw_kept_ref(**args))


def test_ties_of_the_race_go_to_the_lower_id():
    """Equal scores in one chunk and across chunks: the first wins, as torch's argmax."""
    vocab = 3 * CHUNK
    logits = torch.zeros(2, vocab, device=DEVICE)
    noise = torch.ones(2, vocab, device=DEVICE)
    one = torch.ones(2, device=DEVICE)
    args = dict(logits=logits, noise=noise, temperature=one, row_max=torch.zeros(2, device=DEVICE),
                bound=torch.full((2,), float("-inf"), device=DEVICE),
                need=torch.zeros(2, dtype=torch.int64, device=DEVICE), min_p=torch.zeros(2, device=DEVICE))
    assert draw_kept(**args, chunk=CHUNK).tolist() == [0, 0]
    wide = dict(args, logits=torch.zeros(2, 2500, device=DEVICE), noise=torch.ones(2, 2500, device=DEVICE))
    assert draw_kept(**wide, chunk=2048).tolist() == [0, 0]  # blocks of 1024 within a chunk
    # kept ties at bound 0: only the first `need` by id; the race's winner then is the last noise minimum
    noise[:, 5] = 0.5
    noise[:, CHUNK + 5] = 0.5
    args["bound"] = torch.zeros(2, device=DEVICE)
    args["need"] = torch.tensor([CHUNK, CHUNK + 6], device=DEVICE)
    assert draw_kept(**args, chunk=CHUNK).tolist() == [5, 5]
    noise[1, 5] = 1.0
    assert draw_kept(**args, chunk=CHUNK).tolist() == [5, CHUNK + 5]
    assert torch.equal(draw_kept(**args, chunk=CHUNK), draw_kept_ref(**args))


@pytest.mark.parametrize("vocab,digit_bits,chunk", [(300, 4, 128), (2000, 4, 512), (2000, 2, 8192)])
def test_top_p_bound_matches_ref(vocab, digit_bits, chunk):
    """Flat, peaked, tied (bf16-rounded and few-valued) and masked rows at several top_p, over one or several
    chunks; unflagged rows keep their bound and need."""
    gen = torch.Generator().manual_seed(vocab + digit_bits)
    rows = [torch.randn(vocab, generator=gen) * 0.5, torch.randn(vocab, generator=gen) * 4,
            (torch.randn(vocab, generator=gen) * 2).bfloat16().float(), tied_logits(1, vocab, seed=digit_bits)[0].cpu(),
            torch.zeros(vocab), torch.randn(vocab, generator=gen)]
    logits = torch.stack(rows).to(DEVICE)
    n = logits.shape[0]
    temperature = torch.tensor([0.7, 1.0, 1.3, 1.0, 1.0, 0.9], device=DEVICE)
    top_p = torch.tensor([0.9, 0.5, 0.95, 0.6, 0.3, 0.999], device=DEVICE)
    row_max, mass = row_stats_ref(logits=logits, temperature=temperature)
    flag = torch.tensor([True, True, True, True, True, False], device=DEVICE)
    out = {}
    for name, fn in (("kernel", top_p_bound), ("ref", top_p_bound_ref)):
        bound = torch.full((n,), -7.0, device=DEVICE)
        need = torch.full((n,), -1, dtype=torch.int64, device=DEVICE)
        kw = dict(digit_bits=digit_bits, chunk=chunk) if name == "kernel" else {}
        fn(logits=logits, temperature=temperature, row_max=row_max, target=top_p * mass, flag=flag, bound=bound,
           need=need, **kw)
        out[name] = bound, need
    assert torch.equal(out["kernel"][0], out["ref"][0]), out
    assert torch.equal(out["kernel"][1], out["ref"][1]), out
    assert out["kernel"][0][-1] == -7.0 and out["kernel"][1][-1] == -1  # the unflagged row is untouched
    assert out["kernel"][1][4] == int(0.3 * vocab) + 1  # a flat row: ties kept while their mass before fits


def test_draw_writes_group_best_and_skips_unflagged_rows():
    n, vocab = 5, 300
    logits = tied_logits(n, vocab, seed=9)
    gen = torch.Generator().manual_seed(9)
    noise = torch.empty(n, vocab).exponential_(generator=gen).to(DEVICE)
    temperature = torch.tensor([0.7, 1.0, 1.5, 0.3, 1.0], device=DEVICE)
    row_max, _ = row_stats_ref(logits=logits, temperature=temperature)
    min_p = torch.tensor([0.0, 0.1, 0.0, 0.5, 0.0], device=DEVICE)
    args = dict(logits=logits, noise=noise, temperature=temperature, row_max=row_max,
                bound=torch.full((n,), float("-inf"), device=DEVICE),
                need=torch.zeros(n, dtype=torch.int64, device=DEVICE), min_p=min_p)
    group_best = torch.full((n, -(-vocab // GROUP)), 7.0, device=DEVICE)
    ids = draw_kept(**args, group_best=group_best, chunk=CHUNK)
    assert torch.equal(ids, draw_kept_ref(**args))
    w = torch.exp(logits / temperature[:, None] - row_max[:, None])
    score = torch.where((logits > float("-inf")) & (w >= min_p[:, None]), w / noise, -1.0)
    padded = torch.full((n, group_best.shape[1] * GROUP), -1.0, device=DEVICE)
    padded[:, :vocab] = score
    torch.testing.assert_close(group_best, padded.view(n, -1, GROUP).amax(dim=-1), rtol=1e-6, atol=0)
    flag = torch.tensor([False, True, False, True, True], device=DEVICE)
    bound = logits[:, 3].clone()  # ties counted in flagged rows only
    tied = dict(args, bound=bound, need=torch.full((n,), 2, dtype=torch.int64, device=DEVICE))
    flagged = draw_kept(**tied, flag=flag, chunk=CHUNK)
    assert torch.equal(flagged[flag], draw_kept_ref(**tied)[flag])


def race_rows(vocab: int, seed: int) -> torch.Tensor:
    """Flat, peaked, bf16-tied, few-valued and masked, all-equal, and mildly flat rows."""
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randn(vocab, generator=gen) * 0.5, torch.randn(vocab, generator=gen) * 4,
            (torch.randn(vocab, generator=gen) * 2).bfloat16().float(), tied_logits(1, vocab, seed=seed)[0].cpu(),
            torch.zeros(vocab), torch.randn(vocab, generator=gen)]
    return torch.stack(rows).to(DEVICE)


@pytest.mark.parametrize("vocab,k,chunk", [(10, 8, 64), (300, 8, 128), (2000, 4, 512), (2000, 16, 8192)])
def test_top_p_race_matches_ref(vocab, k, chunk):
    """The same token and found flag as the sorting reference at several top_p and min_p, over one or several
    chunks; and where found, the token that the boundary's draw (top_p_bound_ref, then draw_kept_ref) gives."""
    logits = race_rows(vocab, seed=vocab + k)
    n = logits.shape[0]
    gen = torch.Generator().manual_seed(k)
    noise = torch.empty(n, vocab).exponential_(generator=gen).to(DEVICE)
    temperature = torch.tensor([0.7, 1.0, 1.3, 1.0, 1.0, 0.9], device=DEVICE)
    row_max, mass = row_stats_ref(logits=logits, temperature=temperature)
    for top_p, min_p in ((0.9, 0.0), (0.3, 0.0), (0.95, 0.3), (0.05, 0.0)):
        target = top_p * mass
        min_ps = torch.full((n,), min_p, device=DEVICE)
        flag = torch.tensor([True, True, True, True, True, False], device=DEVICE)
        args = dict(logits=logits, noise=noise, temperature=temperature, row_max=row_max, target=target,
                    min_p=min_ps, flag=flag)
        group_best = torch.empty(n, -(-vocab // GROUP), device=DEVICE)
        unbounded = dict(bound=torch.full((n,), float("-inf"), device=DEVICE),
                         need=torch.zeros(n, dtype=torch.int64, device=DEVICE))
        draw_kept(logits=logits, noise=noise, temperature=temperature, row_max=row_max, min_p=min_ps,
                  group_best=group_best, **unbounded, chunk=chunk)
        token, found = top_p_race(**args, group_best=group_best, k=k, chunk=chunk)
        ref_token, ref_found = top_p_race_ref(**args, group_best=group_best, k=k)
        assert torch.equal(found, ref_found), (top_p, min_p, found, ref_found)
        assert torch.equal(token[found], ref_token[found]), (top_p, min_p)
        assert not found[-1]  # the unflagged row
        bound, need = torch.full((n,), -7.0, device=DEVICE), torch.full((n,), -1, dtype=torch.int64, device=DEVICE)
        top_p_bound_ref(logits=logits, temperature=temperature, row_max=row_max, target=target, flag=flag,
                        bound=bound, need=need)
        drawn = draw_kept_ref(logits=logits, noise=noise, temperature=temperature, row_max=row_max, bound=bound,
                              need=need, min_p=min_ps)
        assert torch.equal(token[found], drawn[found]), (top_p, min_p)
        if top_p == 0.9 and min_p == 0.0:
            assert found[:5].all()  # kept mass 0.9: one of the k best is kept unless all k land in the 10 %


def test_top_p_race_counts_ties_before_by_id():
    """All-equal rows: the mass before token i is i * w, so top_p 0.25 of 10 keeps ids 0-2 and the winner is the
    best-scoring of them; with k = 1 a winner past them is not found."""
    n, vocab = 3, 10
    logits = torch.zeros(n, vocab, device=DEVICE)
    noise = torch.ones(n, vocab, device=DEVICE)
    noise[0, 2], noise[1, 7], noise[2, 7], noise[2, 1] = 0.5, 0.5, 0.5, 0.6  # the best score: id 2, 7, 7 (then 1)
    one, zero = torch.ones(n, device=DEVICE), torch.zeros(n, device=DEVICE)
    group_best = torch.empty(n, 1, device=DEVICE)
    draw_kept(logits=logits, noise=noise, temperature=one, row_max=zero, bound=torch.full((n,), float("-inf"),
              device=DEVICE), need=torch.zeros(n, dtype=torch.int64, device=DEVICE), min_p=zero, group_best=group_best)
    args = dict(logits=logits, noise=noise, temperature=one, row_max=zero, target=torch.full((n,), 2.5, device=DEVICE),
                min_p=zero, flag=torch.ones(n, dtype=torch.bool, device=DEVICE), group_best=group_best)
    token, found = top_p_race(**args, k=8, chunk=CHUNK)
    assert found.tolist() == [True, True, True] and token.tolist() == [2, 0, 1]
    token, found = top_p_race(**args, k=1, chunk=CHUNK)
    assert found.tolist() == [True, False, False] and token[0] == 2


SM90_SCRIPT = r'''
from triton_kernels import sampling as s, top_p as tp

types = dict(l_ptr="*fp32", e_ptr="*fp32", t_ptr="*fp32", m_ptr="*fp32", mass_ptr="*fp32", bound_ptr="*fp32",
             need_ptr="*i64", min_p_ptr="*fp32", out_ptr="*i64", l_stride="i64", e_stride="i64")
types.update(part_m_ptr="*fp32", part_s_ptr="*fp32", counts_ptr="*i32", keys_ptr="*i64", group_max_ptr="*fp32",
             group_best_ptr="*fp32", flag_ptr="*i8", cand_l_ptr="*fp32", cand_id_ptr="*i64", part_ptr="*fp32")
consts = dict(CHUNK=s.CHUNK, BLOCK=s.BLOCK)
for groups in (False, True):
    out[f"row_stats groups {groups}"] = compile_sm90(s._row_stats_kernel, types, dict(consts, GROUPS=groups,
                                                     GROUP=s.GROUP), s.NUM_WARPS, 1)
out["tie_count"] = compile_sm90(s._tie_count_kernel, types, dict(consts, FLAGGED=True), s.NUM_WARPS, 1)
for ties, best in ((False, False), (True, False), (True, True)):
    out[f"draw_kept ties {ties} group_best {best}"] = compile_sm90(s._draw_kept_kernel, types, dict(
        consts, TIES=ties, BLOCK_C=32, GROUP_BEST=best, GROUP=s.GROUP, FLAGGED=best), s.NUM_WARPS, 1)
types.update(target_ptr="*fp32", groups_ptr="*i64", best_ptr="*fp32", token_ptr="*i64", found_ptr="*i8")
out["race_candidates"] = compile_sm90(tp._race_candidates_kernel, types, dict(K=8, GROUP=s.GROUP, TAKEN=8),
                                      s.NUM_WARPS, 1)
out["race_before"] = compile_sm90(tp._race_before_kernel, types, dict(CHUNK=s.CHUNK, BLOCK=tp.RACE_BLOCK, K=8),
                                  s.NUM_WARPS, 1)
out["race_final"] = compile_sm90(tp._race_final_kernel, types, dict(K=8, BLOCK_C=32), 1, 1)
top_p = dict(types, target_ptr="*fp32", flag_ptr="*i8", hist_ptr="*fp32", count_ptr="*i32", prefix_ptr="*i32",
             above_ptr="*fp32")
for last in (False, True):
    out[f"top_p_pass last {last}"] = compile_sm90(tp._top_p_pass_kernel, top_p, dict(
        CHUNK=s.CHUNK, BLOCK=tp.BOUND_BLOCK, BLOCK_C=32, RADIX=16, DIGIT_BITS=4, LAST=last), s.NUM_WARPS, 1)
out["top_p_final"] = compile_sm90(tp._top_p_final_kernel, top_p, dict(BLOCK_C=32, RADIX=16), 1, 1)
print(json.dumps(out))
'''


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the tests above run the compiled kernels")
def test_kernels_compile_for_hopper_without_spills():
    from tests.kernels.sm90 import compile_sm90_in_subprocess

    results = compile_sm90_in_subprocess(SM90_SCRIPT)
    assert set(results) == {"row_stats groups False", "row_stats groups True", "tie_count",
                            "draw_kept ties False group_best False", "draw_kept ties True group_best False",
                            "draw_kept ties True group_best True", "race_candidates", "race_before", "race_final",
                            "top_p_pass last False",
                            "top_p_pass last True", "top_p_final"}
    assert all(spilled == 0 for _, spilled in results.values()), results

