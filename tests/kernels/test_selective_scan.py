"""Mamba-1 prefill over packed varlen sequences: the reference against the decode-step reference,
then mamba1_prefill (Triton) against the reference, called by keyword.

CPU runs the Triton interpreter in float32 on tiny odd shapes; inputs are strided views of the
projection rows; sequences sit in unordered slots, some start from the slot's state and some
from zeros.
"""

import pytest
import torch

from tests.kernels.test_ssd_chunk import snapshot_args
from tests.kernels.test_ssm_step import DEVICE, mamba1_inputs, rows, slots_tensor, state_pool
from triton_kernels.selective_scan import mamba1_prefill, mamba1_prefill_ref
from triton_kernels.ssm_step import mamba1_decode, mamba1_decode_ref

TOL = dict(atol=1e-5, rtol=1e-5)  # float32, the same sequential order in both


def varlen(lens):
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    return cu.to(DEVICE)


def flags(values):
    return torch.tensor(values, device=DEVICE)


def test_ref_equals_decode_steps():
    """Prefill of each sequence == the decode-step reference applied token by token from the same
    starting state (the slot's, or zeros without an initial state)."""
    Dm, N, lens, slots, has_init = 5, 3, [4, 1, 3], [2, 0, 3], [True, False, True]
    kw = mamba1_inputs(sum(lens), Dm, N, seed=4)
    states = state_pool(5, Dm, N)
    prefilled, stepped = states.clone(), states.clone()
    y = mamba1_prefill_ref(**kw, ssm_states=prefilled, cu_seqlens=varlen(lens), state_slots=slots_tensor(slots),
                           has_initial_state=flags(has_init))
    bounds = varlen(lens).tolist()
    for i, slot in enumerate(slots):
        if not has_init[i]:
            stepped[slot] = 0.0
        for t in range(bounds[i], bounds[i + 1]):
            y_t = mamba1_decode_ref(**rows(kw, slice(t, t + 1)), ssm_states=stepped, state_slots=slots_tensor([slot]))
            torch.testing.assert_close(y_t[0], y[t])
    torch.testing.assert_close(prefilled, stepped)
    torch.testing.assert_close(prefilled[[1, 4]], states[[1, 4]])  # slots of no sequence are untouched


# ---------------------------------------------------------------- Triton vs reference


def prefill_both(kw, states, lens, slots, has_init):
    args = dict(**kw, cu_seqlens=varlen(lens), state_slots=slots_tensor(slots), has_initial_state=flags(has_init))
    ours, ref = states.clone(), states.clone()
    y = mamba1_prefill(**args, ssm_states=ours)
    y_ref = mamba1_prefill_ref(**args, ssm_states=ref)
    return y, y_ref, ours, ref


@pytest.mark.parametrize("lens,Dm,N,gated,with_dt_bias", [
    ([1], 8, 4, True, True), ([7, 1, 12], 20, 16, True, False), ([5, 9], 33, 7, False, True),
    ([3, 0, 4], 40, 16, True, True), ([37, 16, 17], 24, 16, True, True)])
def test_prefill_matches_ref(lens, Dm, N, gated, with_dt_bias):
    """Odd Dm and N, an empty sequence, sequences over several chunks of N tokens and shorter than one,
    dt_bias None, strided inputs, unordered slots, with and without initial states; slots of no sequence
    keep their state."""
    kw = mamba1_inputs(sum(lens), Dm, N, gated=gated, with_dt_bias=with_dt_bias, seed=len(lens) + Dm)
    states = state_pool(6, Dm, N)
    slots, has_init = [4, 0, 2][: len(lens)], [True, False, True][: len(lens)]
    y, y_ref, ours, ref = prefill_both(kw, states, lens, slots, has_init)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    untouched = [s for s in range(6) if s not in slots]
    assert torch.equal(ours[untouched], states[untouched])


@pytest.mark.parametrize("inputs,pool", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
def test_prefill_dtypes(inputs, pool):
    lens = [6, 3]
    kw = mamba1_inputs(sum(lens), 24, 16, dtype=inputs, seed=9)
    states = state_pool(4, 24, 16, dtype=pool)
    y, y_ref, ours, ref = prefill_both(kw, states, lens, [3, 1], [True, True])
    assert y.dtype == inputs and ours.dtype == pool
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(ours, ref)


@pytest.mark.parametrize("pieces", [[4, 1, 6], [11]])
def test_prefill_in_pieces_then_decode(pieces):
    """The serving invariant with the kernels: chunked prefill in pieces (each resuming from the slot)
    and then decode steps == one reference prefill over all tokens."""
    Dm, N, decoded, slot = 12, 16, 3, 2
    total = sum(pieces) + decoded
    kw = mamba1_inputs(total, Dm, N, seed=30)
    states = state_pool(4, Dm, N)
    whole, split = states.clone(), states.clone()
    y_all = mamba1_prefill_ref(**kw, ssm_states=whole, cu_seqlens=varlen([total]), state_slots=slots_tensor([slot]),
                               has_initial_state=flags([False]))
    start = 0
    for i, n in enumerate(pieces):
        y = mamba1_prefill(**rows(kw, slice(start, start + n)), ssm_states=split, cu_seqlens=varlen([n]),
                           state_slots=slots_tensor([slot]), has_initial_state=flags([i > 0]))
        torch.testing.assert_close(y, y_all[start : start + n], atol=1e-5, rtol=1e-5)
        start += n
    for t in range(start, total):
        y = mamba1_decode(**rows(kw, torch.tensor([t, t], device=DEVICE)), ssm_states=split,
                          state_slots=slots_tensor([-1, slot]))
        torch.testing.assert_close(y[1], y_all[t], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(split, whole, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lens,cuts,has_init,gated,with_dt_bias", [
    # p = 1 and the sequence end; no cut; several cuts, consecutive ones among them
    ([5, 31, 32, 33], [[1, 5], [], [16, 31], [2, 3, 17, 33]], [True, False, True, False], True, True),
    ([40, 1], [[1, 20, 39, 40], [1]], [False, True], False, False),
])
def test_prefill_snapshots(lens, cuts, has_init, gated, with_dt_bias):
    """Snapshots of the state after p tokens, written as the scan passes them: (a) kernel ==
    reference on the whole pool, outputs and final states as without cuts; (b) the reference's
    snapshot == the reference's final state over the first p tokens alone; (c) the kernel
    continuing from a snapshot over the remaining tokens == the uncut run (outputs, final state)."""
    Dm, N = 12, 16  # two channel blocks of 8, the second half masked
    kw = mamba1_inputs(sum(lens), Dm, N, gated=gated, with_dt_bias=with_dt_bias, seed=40)
    slots = [3, 0, 5, 1][: len(lens)]
    snap, flat = snapshot_args(cuts, first_slot=6)
    states = state_pool(6 + len(flat) + 1, Dm, N)  # one slot more that nothing writes
    args = dict(**kw, cu_seqlens=varlen(lens), state_slots=slots_tensor(slots), has_initial_state=flags(has_init))

    ours, ref, uncut = states.clone(), states.clone(), states.clone()
    y = mamba1_prefill(**args, ssm_states=ours, **snap)
    y_ref = mamba1_prefill_ref(**args, ssm_states=ref, **snap)
    y_uncut = mamba1_prefill(**args, ssm_states=uncut)
    torch.testing.assert_close(y, y_ref, **TOL)  # (a)
    torch.testing.assert_close(ours, ref, **TOL)
    torch.testing.assert_close(y, y_uncut, **TOL)
    torch.testing.assert_close(ours[:6], uncut[:6], **TOL)
    assert torch.equal(ours[-1], states[-1])

    # (b) and (c) as one batch each: sequence k of the batch is cut k's prefix or remainder
    bounds = varlen(lens).tolist()
    prefix_rows = [torch.arange(bounds[i], bounds[i] + p) for i, p, _ in flat]
    rest_rows = [torch.arange(bounds[i] + p, bounds[i + 1]) for i, p, _ in flat]
    cut_slots = [s for _, _, s in flat]
    prefixes = states.clone()
    prefixes[cut_slots] = states[[slots[i] for i, _, _ in flat]]  # each cut's initial state
    mamba1_prefill_ref(**rows(kw, torch.cat(prefix_rows).to(DEVICE)), ssm_states=prefixes,
                       cu_seqlens=varlen([len(r) for r in prefix_rows]), state_slots=slots_tensor(cut_slots),
                       has_initial_state=flags([has_init[i] for i, _, _ in flat]))
    torch.testing.assert_close(ref[cut_slots], prefixes[cut_slots], **TOL)

    rest = ours.clone()
    y_rest = mamba1_prefill(**rows(kw, torch.cat(rest_rows).to(DEVICE)), ssm_states=rest,
                            cu_seqlens=varlen([len(r) for r in rest_rows]), state_slots=slots_tensor(cut_slots),
                            has_initial_state=flags([True] * len(flat)))
    torch.testing.assert_close(y_rest, y_uncut[torch.cat(rest_rows).to(DEVICE)], **TOL)
    torch.testing.assert_close(rest[cut_slots], uncut[[slots[i] for i, _, _ in flat]], **TOL)


def test_prefill_snapshots_bf16_pool():
    """A bf16 pool gets each snapshot rounded once from the fp32 state, like the final state."""
    lens, cuts = [9, 4], [[3, 9], [2]]
    kw = mamba1_inputs(sum(lens), 16, 16, seed=41)
    snap, flat = snapshot_args(cuts, first_slot=2)
    states = state_pool(2 + len(flat), 16, 16, dtype=torch.bfloat16)
    args = dict(**kw, cu_seqlens=varlen(lens), state_slots=slots_tensor([1, 0]), has_initial_state=flags([True, True]))
    ours, ref = states.clone(), states.clone()
    mamba1_prefill(**args, ssm_states=ours, **snap)
    mamba1_prefill_ref(**args, ssm_states=ref, **snap)
    torch.testing.assert_close(ours, ref)
