"""Mamba-1 prefill over packed varlen sequences: the reference against the decode-step reference,
then mamba1_prefill (Triton) against the reference, called by keyword.

CPU runs the Triton interpreter in float32 on tiny odd shapes; inputs are strided views of the
projection rows; sequences sit in unordered slots, some start from the slot's state and some
from zeros.
"""

import torch

from tests.kernels.test_ssm_step import DEVICE, mamba1_inputs, rows, slots_tensor, state_pool
from triton_kernels.selective_scan import mamba1_prefill_ref
from triton_kernels.ssm_step import mamba1_decode_ref


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
