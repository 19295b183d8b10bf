"""causal_conv1d_rows (token by token over short rows: verify steps) against causal_conv1d_prefill_ref:
outputs, final states and snapshots after each draft, rows with and without an initial state, rows
shorter than the width, pad-slot rows skipped. CPU runs the Triton interpreter in float32."""

import pytest
import torch

from tests.kernels.test_causal_conv1d import DEVICE, SNAP_SLOTS, conv_params, snap_args, strided_x, varlen
from triton_kernels.causal_conv1d import causal_conv1d_prefill_ref, causal_conv1d_rows, causal_conv1d_rows_ref

ROWS = pytest.mark.parametrize("rows_fn", [causal_conv1d_rows, causal_conv1d_rows_ref], ids=["triton", "torch"])


@ROWS
@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("bias", [True, False])
def test_rows_match_reference(width, bias, rows_fn):
    dim, pad_slot = 24, 5
    lens = [4, 1, 4, 8, 2]
    has_init = [True, True, False, True, True]
    state_slots = [4, 0, 6, 2, 7]
    cuts = [[1, 2, 3], [], [1, 2, 3], [2, 7], [1]]
    x = strided_x(sum(lens), dim, seed=23)
    weight, b, states = conv_params(dim, width, bias=bias, num_slots=20)
    kwargs = dict(x=x, weight=weight, bias=b, cu_seqlens=varlen(lens), state_slots=torch.tensor(state_slots,
                  device=DEVICE), has_initial_state=torch.tensor(has_init, device=DEVICE))
    snaps = snap_args(cuts, SNAP_SLOTS, pad_slot)
    ours, ref = states.clone(), states.clone()
    y = rows_fn(**kwargs, **snaps, conv_states=ours, pad_slot=pad_slot)
    y_ref = causal_conv1d_prefill_ref(**kwargs, **snaps, conv_states=ref)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=0, rtol=0)  # snapshot rows, final states, untouched rows


@ROWS
def test_pad_rows_are_skipped(rows_fn):
    dim, pad_slot, lens = 16, 5, [3, 11]
    x = strided_x(sum(lens), dim, seed=29)
    weight, b, states = conv_params(dim, 4, num_slots=8)
    ours, ref = states.clone(), states.clone()
    y = rows_fn(x=x, weight=weight, bias=b, conv_states=ours, cu_seqlens=varlen(lens),
                state_slots=torch.tensor([3, pad_slot], device=DEVICE),
                has_initial_state=torch.tensor([True, False], device=DEVICE), pad_slot=pad_slot)
    y_ref = causal_conv1d_prefill_ref(x=x[:3], weight=weight, bias=b, conv_states=ref, cu_seqlens=varlen([3]),
                                      state_slots=torch.tensor([3], device=DEVICE),
                                      has_initial_state=torch.tensor([True], device=DEVICE))
    torch.testing.assert_close(y[:3], y_ref, atol=1e-5, rtol=1e-5)
    assert torch.equal(y[3:], torch.zeros_like(y[3:]))
    assert torch.equal(ours, ref)
