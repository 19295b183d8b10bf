"""gdn_rows (token by token over short rows) against gdn_prefill_ref, and against the decode kernel
step by step (the verify step must give what plain decoding gives).

CPU runs the Triton interpreter in float32 on tiny shapes; rows are of 1..8 tokens, with and without
an initial state, with snapshot cuts after each draft (a verify step) and pad-slot rows."""

import pytest
import torch

from tests.kernels.test_gdn_chunk import DEVICE, SNAP_SLOTS, TOL, batch_args, gdn_inputs, pool, rows, snap_args
from triton_kernels.gdn_chunk import gdn_prefill_ref
from triton_kernels.gdn_recurrent import gdn_decode
from triton_kernels.gdn_short_rows import gdn_rows, gdn_rows_ref

CASES = [  # (lens, has_init, cuts per row, hk, hv, dk, dv)
    ([4, 4, 4], [True, True, True], [[1, 2, 3], [1, 2, 3], [1, 2, 3]], 1, 2, 16, 16),  # verify, k = 3
    ([1, 4, 8, 2], [True, False, True, True], [[], [1, 2, 3], [2, 7], [1]], 2, 4, 32, 16),
    ([3], [True], [[]], 1, 1, 128, 32),  # K = 128
]


@pytest.mark.parametrize("lens,has_init,cuts,hk,hv,dk,dv", CASES)
def test_rows_match_reference(lens, has_init, cuts, hk, hv, dk, dv):
    pad_slot, state_slots = 5, [4, 0, 6, 2][: len(lens)]
    x = gdn_inputs(sum(lens), hk, hv, dk, dv, seed=23)
    states = pool(16, hv, dk, dv)
    args = batch_args(lens, state_slots, has_init)
    snaps = snap_args(cuts, SNAP_SLOTS, pad_slot)
    ours, ref = states.clone(), states.clone()
    o = gdn_rows(**x, **args, **snaps, ssm_states=ours, pad_slot=pad_slot)
    o_ref = gdn_prefill_ref(**x, **args, **snaps, ssm_states=ref)
    torch.testing.assert_close(o, o_ref, **TOL)
    torch.testing.assert_close(ours, ref, **TOL)  # snapshot rows, final states, every other row untouched
    assert torch.equal(ours[pad_slot], states[pad_slot])


@pytest.mark.parametrize("lens,has_init,cuts,hk,hv,dk,dv", CASES)
def test_torch_rows_match_chunked_reference(lens, has_init, cuts, hk, hv, dk, dv):
    """gdn_rows_ref (the CPU backend's verify step: batched token steps) against the chunked torch math."""
    pad_slot, state_slots = 5, [4, 0, 6, 2][: len(lens)]
    x = {name: t.cpu() for name, t in gdn_inputs(sum(lens), hk, hv, dk, dv, seed=23).items()}
    states = pool(16, hv, dk, dv).cpu()
    args = {name: t.cpu() for name, t in batch_args(lens, state_slots, has_init).items()}
    snaps = {name: t.cpu() for name, t in snap_args(cuts, SNAP_SLOTS, pad_slot).items()}
    ours, ref = states.clone(), states.clone()
    o = gdn_rows_ref(**x, **args, **snaps, ssm_states=ours, pad_slot=pad_slot)
    o_ref = gdn_prefill_ref(**x, **args, **snaps, ssm_states=ref)
    torch.testing.assert_close(o, o_ref, atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(ours, ref, atol=2e-5, rtol=2e-5)


def test_torch_rows_replay_and_pad_rows_match_the_kernel():
    """gdn_rows_ref with pad rows, write_final=False and row_lens gives what the kernel gives."""
    lens, kept, pad_slot = [4, 4, 3, 4], [2, 4, 3, 1], 9
    x = gdn_inputs(sum(lens), 1, 2, 16, 16, seed=43)
    states = pool(12, 2, 16, 16)
    args = batch_args(lens, [0, 1, pad_slot, 3], [True, False, True, True])
    for extra in ({"write_final": False}, {"row_lens": torch.tensor(kept, dtype=torch.int32, device=DEVICE)}):
        ours, ref = states.clone(), states.clone()
        o = gdn_rows(**x, **args, ssm_states=ours, pad_slot=pad_slot, **extra)
        o_ref = gdn_rows_ref(**x, **args, ssm_states=ref, pad_slot=pad_slot, **extra)
        run = kept if "row_lens" in extra else lens
        written = torch.cat([torch.arange(s, s + n) for row, (s, n) in enumerate(zip([0, 4, 8, 11], run)) if row != 2])
        torch.testing.assert_close(o[written], o_ref[written], **TOL)  # (the kernel leaves the rest unwritten)
        assert not o_ref[8:11].any()  # the pad row's outputs
        torch.testing.assert_close(ours, ref, **TOL)
        assert torch.equal(ref[pad_slot], states[pad_slot])


def test_pad_rows_are_skipped():
    """A pad-slot row (a padded graph shape's) of many tokens: zero outputs, no state written."""
    pad_slot, lens = 5, [2, 11]
    x = gdn_inputs(sum(lens), 1, 2, 16, 16, seed=29)
    states = pool(8, 2, 16, 16)
    ours = states.clone()
    o = gdn_rows(**x, **batch_args(lens, [3, pad_slot], [True, False]), ssm_states=ours, pad_slot=pad_slot)
    ref = states.clone()
    o_ref = gdn_prefill_ref(**rows(x, 0, 2), **batch_args([2], [3], [True]), ssm_states=ref)
    torch.testing.assert_close(o[:2], o_ref, **TOL)
    assert torch.equal(o[2:], torch.zeros_like(o[2:]))
    torch.testing.assert_close(ours, ref, **TOL)


def test_rows_equal_decode_steps():
    """A row of 4 tokens from its slot gives, token for token, the outputs and states of 4 decode steps:
    the same update in the same order (float32 exact up to the fused ops' rounding)."""
    hv, n = 2, 4
    x = gdn_inputs(n, 1, hv, 16, 16, seed=31)
    states = pool(4, hv, 16, 16)
    ours, steps = states.clone(), states.clone()
    o = gdn_rows(**x, **batch_args([n], [1], [True]), **snap_args([[1, 2, 3]], [0, 2, 3], -1), ssm_states=ours)
    slot = torch.tensor([1], dtype=torch.int32, device=DEVICE)
    for t in range(n):
        xt = rows(x, t, t + 1)
        o_t = gdn_decode(q=xt["q"], k=xt["k"], v=xt["v"], a=xt["a"], b=xt["b"], A_log=x["A_log"],
                         dt_bias=x["dt_bias"], ssm_states=steps, state_slots=slot)
        torch.testing.assert_close(o[t:t + 1], o_t, atol=1e-6, rtol=1e-6)
        if t < n - 1:
            torch.testing.assert_close(ours[[0, 2, 3][t]], steps[1], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ours[1], steps[1], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kept", [1, 2, 4])
def test_replaying_kept_tokens_gives_the_snapshot_state(kept):
    """The two rollback designs agree. A verify row of 4 tokens run with write_final=False leaves its slot
    as it was and gives the same outputs; replaying its first `kept` tokens from that slot then leaves
    the state that the snapshot design wrote after `kept` tokens (the slot itself when all 4 are kept)."""
    hv, n = 2, 4
    x = gdn_inputs(n, 1, hv, 16, 16, seed=37)
    states = pool(6, hv, 16, 16)
    snapped, kept_slot = states.clone(), states.clone()
    args = batch_args([n], [1], [True])
    o = gdn_rows(**x, **args, **snap_args([[1, 2, 3]], [0, 2, 3], -1), ssm_states=snapped)
    o_checkpoint = gdn_rows(**x, **args, ssm_states=kept_slot, write_final=False)
    torch.testing.assert_close(o_checkpoint, o, atol=0, rtol=0)
    assert torch.equal(kept_slot, states)  # every slot as before, the row's own included
    gdn_rows(**rows(x, 0, kept), **batch_args([kept], [1], [True]), ssm_states=kept_slot)
    expected = snapped[[0, 2, 3, 1][kept - 1]]
    torch.testing.assert_close(kept_slot[1], expected, atol=1e-6, rtol=1e-6)


def test_replay_in_place_runs_each_rows_kept_tokens():
    """row_lens: the replay of a whole verify step in one launch, over the verify step's own inputs. Rows of
    4 tokens keeping 1, 3, 4 and 2 end in the states the snapshot design keeps, and their outputs for the
    tokens run equal the verify step's."""
    lens, kept, hv = [4, 4, 4, 4], [1, 3, 4, 2], 2
    x = gdn_inputs(sum(lens), 1, hv, 16, 16, seed=41)
    states = pool(20, hv, 16, 16)
    slots, snap_rows = [0, 1, 2, 3], [[4, 5, 6], [7, 8, 9], [10, 11, 12], [13, 14, 15]]
    args = batch_args(lens, slots, [True, True, True, False])
    snapped, replayed = states.clone(), states.clone()
    o = gdn_rows(**x, **args, **snap_args([[1, 2, 3]] * 4, sum(snap_rows, []), -1), ssm_states=snapped)
    gdn_rows(**x, **args, ssm_states=replayed, write_final=False)
    o_replay = gdn_rows(**x, **args, ssm_states=replayed,
                        row_lens=torch.tensor(kept, dtype=torch.int32, device=DEVICE))
    for row, (m, snaps) in enumerate(zip(kept, snap_rows)):
        expected = snapped[row] if m == 4 else snapped[snaps[m - 1]]
        torch.testing.assert_close(replayed[row], expected, atol=1e-6, rtol=1e-6)
        start = 4 * row
        torch.testing.assert_close(o_replay[start:start + m], o[start:start + m], atol=1e-6, rtol=1e-6)
    assert torch.equal(replayed[16:], states[16:])  # no other slot written
