"""Masked state-row copies (triton_kernels/state_rows.py) against the torch reference and against what they
must do: flagged rows take their source's state in every layer, every other row stays as it was."""

import pytest
import torch

from triton_kernels.state_rows import copy_state_rows, copy_state_rows_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("shape", [(3, 10, 2, 5), (2, 9, 4, 3, 700)])  # conv-like; ssm-like, over one block a row
def test_flagged_rows_take_their_source_and_the_rest_stay(shape):
    g = torch.Generator().manual_seed(0)
    state = torch.randn(*shape, generator=g).to(DEVICE)
    src = torch.tensor([7, 8, 6, 5], device=DEVICE)
    dst = torch.tensor([0, 1, 2, 3], device=DEVICE)
    flags = torch.tensor([1, 0, 1, 0], device=DEVICE)
    expected = state.clone()
    expected[:, 0], expected[:, 2] = state[:, 7], state[:, 6]
    ref = state.clone()
    copy_state_rows_ref(state=ref, src=src, dst=dst, flags=flags)
    copy_state_rows(state=state, src=src, dst=dst, flags=flags)
    assert torch.equal(ref, expected)
    assert torch.equal(state, expected)
