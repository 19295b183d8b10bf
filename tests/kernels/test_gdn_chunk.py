"""gdn_prefill (Triton) vs gdn_prefill_ref, and both vs the token-by-token recurrence.

CPU runs the Triton interpreter in float32 on tiny odd shapes (each kernel call costs a second or
so there). Inputs are strided views of one projection row, as the model passes them; the state pool
has unordered slots; sequences are shorter than, equal to and longer than a chunk (64 tokens).
"""

import pytest
import torch

from triton_kernels.gdn_chunk import gdn_prefill, gdn_prefill_ref
from triton_kernels.gdn_recurrent import gdn_decode, gdn_decode_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(atol=1e-4, rtol=1e-4)  # float32; the chunked form sums in another order


def gdn_inputs(num_tokens, hk, hv, dk, dv, *, dtype=torch.float32, seed=0):
    """q, k, v, a, b as strided views of one projection, and the per-head parameters."""
    g = torch.Generator().manual_seed(seed)
    sizes = [hk * dk, hk * dk, hv * dv, hv, hv]
    proj = torch.randn(num_tokens, sum(sizes) + 3, generator=g).to(device=DEVICE, dtype=dtype)
    q, k, v, b, a = proj[:, : sum(sizes)].split(sizes, dim=-1)
    return dict(
        q=q.view(num_tokens, hk, dk), k=k.view(num_tokens, hk, dk), v=v.view(num_tokens, hv, dv), a=a, b=b,
        A_log=torch.empty(hv).uniform_(-3, 1, generator=g).to(DEVICE),
        dt_bias=torch.empty(hv).uniform_(-1, 1, generator=g).to(DEVICE),
    )


def pool(num_slots, hv, dk, dv, *, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (0.5 * torch.randn(num_slots, hv, dk, dv, generator=g)).to(DEVICE)


def batch_args(lens, slots, has_init):
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    return dict(cu_seqlens=cu.to(DEVICE), state_slots=torch.tensor(slots, device=DEVICE),
                has_initial_state=torch.tensor(has_init, device=DEVICE))


def rows(x, start, end):
    """Token rows [start, end) of every tensor input (the per-head parameters stay whole)."""
    return {name: t[start:end] if name in ("q", "k", "v", "a", "b") else t for name, t in x.items()}


CASES = [  # (lens, hk, hv, dk, dv)
    ([1], 1, 1, 16, 16),
    ([5], 1, 2, 16, 32),
    ([63], 2, 4, 32, 16),
    ([64], 1, 2, 32, 32),
    ([65], 1, 1, 16, 16),
    ([130], 1, 2, 16, 16),
    ([3, 64, 1, 70], 1, 2, 16, 16),
    ([17, 2, 33], 2, 2, 16, 16),
    ([70], 1, 2, 128, 128),  # the real head dims: [64, 128] tiles, W and U in two V slices
]


@pytest.mark.parametrize("lens,hk,hv,dk,dv", CASES)
def test_prefill_matches_ref(lens, hk, hv, dk, dv):
    x = gdn_inputs(sum(lens), hk, hv, dk, dv)
    states = pool(7, hv, dk, dv)
    args = batch_args(lens, [4, 0, 6, 2][: len(lens)], [True, False, True, True][: len(lens)])
    ours, ref = states.clone(), states.clone()
    o = gdn_prefill(**x, **args, ssm_states=ours)
    o_ref = gdn_prefill_ref(**x, **args, ssm_states=ref)
    torch.testing.assert_close(o, o_ref, **TOL)
    torch.testing.assert_close(ours, ref, **TOL)  # written slots, and the others untouched


def test_prefill_with_repeated_keys():
    """Identical keys, no decay and beta near 1 make I + A nearly all-ones lower triangular, the hard
    case for the blocked inverse (its exact inverse is bidiagonal, its Neumann terms grow binomially)."""
    x = gdn_inputs(130, 1, 2, 16, 16, seed=5)
    x["k"] = x["k"][:1].expand_as(x["k"])  # every token has the same key
    x["a"] = torch.full_like(x["a"], -30.0)  # softplus(a + dt_bias) ~ 0: no decay
    x["b"] = torch.full_like(x["b"], 8.0)  # beta ~ 1
    states = pool(2, 2, 16, 16)
    args = batch_args([130], [1], [True])
    ours, ref = states.clone(), states.clone()
    o = gdn_prefill(**x, **args, ssm_states=ours)
    o_ref = gdn_prefill_ref(**x, **args, ssm_states=ref)
    torch.testing.assert_close(o, o_ref, **TOL)
    torch.testing.assert_close(ours, ref, **TOL)


def test_prefill_ignores_states_without_initial_state():
    """A slot without an initial state may hold anything (NaN here): it must not be read."""
    x = gdn_inputs(9, 1, 2, 16, 16, seed=3)
    states = pool(4, 2, 16, 16)
    states[1] = float("nan")
    args = batch_args([4, 5], [1, 3], [False, True])
    ours, ref = states.clone(), states.clone()
    o = gdn_prefill(**x, **args, ssm_states=ours, scale=0.2)
    o_ref = gdn_prefill_ref(**x, **args, ssm_states=ref, scale=0.2)
    assert torch.isfinite(o).all() and torch.isfinite(ours[1]).all()
    torch.testing.assert_close(o, o_ref, **TOL)
    torch.testing.assert_close(ours, ref, **TOL)


def test_prefill_rejects_other_chunk_sizes():
    x = gdn_inputs(4, 1, 1, 16, 16)
    with pytest.raises(ValueError, match="chunk_size"):
        gdn_prefill(**x, **batch_args([4], [0], [False]), ssm_states=pool(1, 1, 16, 16), chunk_size=32)


def test_ref_matches_token_recurrence():
    """The chunked reference equals gdn_decode_ref applied token by token (the plain recurrence)."""
    total, hk, hv = 70, 1, 2
    x = gdn_inputs(total, hk, hv, 16, 16, seed=7)
    states = pool(3, hv, 16, 16)
    chunked, stepped = states.clone(), states.clone()
    o_ref = gdn_prefill_ref(**x, **batch_args([total], [2], [True]), ssm_states=chunked)
    slot = torch.tensor([2], device=DEVICE)
    o_steps = torch.cat([gdn_decode_ref(**rows(x, t, t + 1), ssm_states=stepped, state_slots=slot)
                         for t in range(total)])
    torch.testing.assert_close(o_ref, o_steps, **TOL)
    torch.testing.assert_close(chunked, stepped, **TOL)


@pytest.mark.parametrize("total", [1, 64, 65])
def test_prefill_then_decode(total):
    """Serving: prefill T tokens with the kernel, one decode step with the kernel, equals the
    reference over T + 1 tokens (outputs and final state)."""
    hk, hv = 1, 2
    x = gdn_inputs(total + 1, hk, hv, 16, 16, seed=11)
    states = pool(5, hv, 16, 16)
    ref = states.clone()
    o_ref = gdn_prefill_ref(**x, **batch_args([total + 1], [3], [True]), ssm_states=ref)
    ours = states.clone()
    o_pre = gdn_prefill(**rows(x, 0, total), **batch_args([total], [3], [True]), ssm_states=ours)
    o_dec = gdn_decode(**rows(x, total, total + 1), ssm_states=ours, state_slots=torch.tensor([3], device=DEVICE),
                       pad_slot=4)
    torch.testing.assert_close(torch.cat([o_pre, o_dec]), o_ref, **TOL)
    torch.testing.assert_close(ours, ref, **TOL)


@pytest.mark.parametrize("split", [5, 64, 100])
def test_prefill_in_pieces(split):
    """Chunked prefill: the prompt in two pieces, the second continuing from the slot, equals one
    piece, for a fresh request next to one continuing its own state in the same batches."""
    total, hk, hv = 130, 1, 2
    x = gdn_inputs(total, hk, hv, 16, 16, seed=13)
    other = gdn_inputs(2, hk, hv, 16, 16, seed=14)
    states = pool(4, hv, 16, 16)
    whole, pieces = states.clone(), states.clone()
    o_whole = gdn_prefill(**x, **batch_args([total], [1], [False]), ssm_states=whole)
    outs = []
    for (start, end), init in (((0, split), False), ((split, total), True)):
        batch = {name: torch.cat([rows(x, start, end)[name], other[name][:1]]) if name in ("q", "k", "v", "a", "b")
                 else x[name] for name in x}
        o = gdn_prefill(**batch, **batch_args([end - start, 1], [1, 3], [init, True]), ssm_states=pieces)
        outs.append(o[: end - start])
    torch.testing.assert_close(torch.cat(outs), o_whole, **TOL)
    torch.testing.assert_close(pieces[1], whole[1], **TOL)


def snap_args(cuts, slots, pad_slot):
    """snap_pos, snap_slots [N, C] from each sequence's cut positions, taking snapshot slots from
    `slots` in order; unused entries hold -1 and a live slot (pad_slot) that must stay untouched."""
    width = max(1, *(len(c) for c in cuts))
    pos = torch.full((len(cuts), width), -1, dtype=torch.int32)
    dst = torch.full((len(cuts), width), pad_slot, dtype=torch.int32)
    free = iter(slots)
    for n, seq_cuts in enumerate(cuts):
        for c, p in enumerate(seq_cuts):
            pos[n, c], dst[n, c] = p, next(free)
    return dict(snap_pos=pos.to(DEVICE), snap_slots=dst.to(DEVICE))


SNAP_SLOTS = [15, 8, 11, 1, 13, 9, 3, 12, 10, 14]  # unordered pool rows for snapshots
SNAP_CASES = [  # (lens, has_init, cuts per sequence, hk, hv, dk, dv)
    ([130], [True], [[1, 63, 64, 65, 100, 130]], 1, 2, 16, 16),
    ([5, 63, 64, 65], [False, True, True, False], [[2, 5], [], [64], [1, 30, 31, 65]], 2, 4, 32, 16),
    ([70], [False], [[33, 70]], 1, 1, 128, 32),  # K = 128: the state in two row blocks
    # chunk ends one after another, then one inside the next chunk and the sequence end (two row blocks)
    ([200], [True], [[64, 128, 150, 192, 200]], 1, 1, 128, 16),
]


@pytest.mark.parametrize("lens,has_init,cuts,hk,hv,dk,dv", SNAP_CASES)
def test_prefill_snapshots(lens, has_init, cuts, hk, hv, dk, dv):
    """Snapshots at chunk ends, inside chunks, at p = 1 and at the sequence end, beside sequences
    without cuts: kernel == reference; the cuts leave the outputs and every other pool row as they
    were; and the reference's snapshot at p is the state after a run over the first p tokens."""
    pad_slot, state_slots = 5, [4, 0, 6, 2][: len(lens)]
    x = gdn_inputs(sum(lens), hk, hv, dk, dv, seed=17)
    states = pool(16, hv, dk, dv)
    args = batch_args(lens, state_slots, has_init)
    snaps = snap_args(cuts, SNAP_SLOTS, pad_slot)
    plain, ours, ref = states.clone(), states.clone(), states.clone()
    o_plain = gdn_prefill(**x, **args, ssm_states=plain)
    o = gdn_prefill(**x, **args, **snaps, ssm_states=ours)
    o_ref = gdn_prefill_ref(**x, **args, **snaps, ssm_states=ref)
    torch.testing.assert_close(o, o_ref, **TOL)
    torch.testing.assert_close(ours, ref, **TOL)  # snapshot rows, final states, untouched rows

    written = SNAP_SLOTS[: sum(map(len, cuts))]
    others = [i for i in range(states.shape[0]) if i not in written]
    assert torch.equal(o, o_plain) and torch.equal(ours[others], plain[others])
    assert torch.equal(ours[pad_slot], states[pad_slot])

    free, start = iter(written), 0
    for length, init, slot, seq_cuts in zip(lens, has_init, state_slots, cuts):
        for p in seq_cuts:
            prefix = states.clone()
            gdn_prefill_ref(**rows(x, start, start + p), **batch_args([p], [slot], [init]), ssm_states=prefix)
            torch.testing.assert_close(ref[next(free)], prefix[slot], **TOL)
        start += length


@pytest.mark.parametrize("cut", [1, 64, 100])
def test_prefill_continues_from_snapshot(cut):
    """Serving: a snapshot at p, then a prefill of the remaining tokens from that slot, gives the
    outputs and the final state of the uncut run."""
    total, hk, hv = 130, 1, 2
    x = gdn_inputs(total, hk, hv, 16, 16, seed=19)
    whole = pool(6, hv, 16, 16)
    o_whole = gdn_prefill(**x, **batch_args([total], [1], [True]), **snap_args([[cut]], [4], 0), ssm_states=whole)
    resumed = whole.clone()
    o_rest = gdn_prefill(**rows(x, cut, total), **batch_args([total - cut], [4], [True]), ssm_states=resumed)
    torch.testing.assert_close(o_rest, o_whole[cut:], **TOL)
    torch.testing.assert_close(resumed[4], whole[1], **TOL)


def rel_err(x, ref):
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("lens", [[4096], [1, 63, 64, 65, 1000, 3000]])
def test_prefill_bf16_real_shapes(lens):
    """Qwen3.5-9B linear attention: 16 key heads, 32 value heads, K = V = 128; bf16 inputs, fp32 state."""
    x = gdn_inputs(sum(lens), 16, 32, 128, 128, dtype=torch.bfloat16)
    states = pool(len(lens) + 2, 32, 128, 128)
    args = batch_args(lens, list(range(len(lens)))[::-1], [i % 2 == 0 for i in range(len(lens))])
    ours, ref = states.clone(), states.clone()
    o = gdn_prefill(**x, **args, ssm_states=ours)
    o_ref = gdn_prefill_ref(**x, **args, ssm_states=ref)
    assert rel_err(o, o_ref) < 2e-2
    assert rel_err(ours, ref) < 2e-2
