"""SSM decode steps and the Mamba-1 prefill on CUDA at real shapes, against the torch references:
Mamba2 at Nemotron-H-8B (128 heads, head_dim 64, d_state 128, 8 groups), Mamba-1 at Jamba (8192
channels, d_state 16); bf16 inputs as strided views, fp32 (and bf16) state pools. Skipped without CUDA."""

import pytest
import torch

from tests.kernels.test_ssm_step import mamba1_inputs, mamba2_inputs, slots_tensor
from triton_kernels.selective_scan import mamba1_prefill, mamba1_prefill_ref
from triton_kernels.ssm_step import mamba1_decode, mamba1_decode_ref, mamba2_decode, mamba2_decode_ref

pytestmark = pytest.mark.gpu

H, P, N, G = 128, 64, 128, 8
DM, N1 = 8192, 16


def rel_err(x, ref):
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def cuda_pool(num_slots, *shape, dtype=torch.float32, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (0.1 * torch.randn(num_slots, *shape, generator=g, device="cuda")).to(dtype)


def batch_slots(batch, num_slots):
    """Shuffled slots, the last one (the pad slot) in one row of the batch when batch > 1."""
    slots = torch.randperm(num_slots - 1, device="cuda")[:batch].int()
    if batch > 1:
        slots[batch // 2] = num_slots - 1
    return slots


def check_decode(kernel, ref, kw, states, slots, pad_slot, state_tol):
    ours, theirs = states.clone(), states.clone()
    y = kernel(**kw, ssm_states=ours, state_slots=slots, pad_slot=pad_slot)
    y_ref = ref(**kw, ssm_states=theirs, state_slots=slots, pad_slot=pad_slot)
    torch.cuda.synchronize()
    assert rel_err(y, y_ref) < 1e-2
    assert rel_err(ours, theirs) < state_tol
    assert (y[slots == pad_slot] == 0).all()
    assert torch.equal(ours[pad_slot], states[pad_slot])
    untouched = torch.ones(states.shape[0], dtype=torch.bool, device="cuda")
    untouched[slots.long()] = False
    assert torch.equal(ours[untouched], states[untouched])


@pytest.mark.parametrize("batch", [1, 8, 64, 256])
def test_mamba2_decode_nemotron_h_shape(batch):
    kw = mamba2_inputs(batch, H, G, P, N, dtype=torch.bfloat16, seed=batch)
    num_slots = batch + 8
    check_decode(mamba2_decode, mamba2_decode_ref, kw, cuda_pool(num_slots, H, P, N), batch_slots(batch, num_slots),
                 num_slots - 1, state_tol=1e-5)


@pytest.mark.parametrize("batch", [1, 64])
def test_mamba2_decode_bf16_pool(batch):
    kw = mamba2_inputs(batch, H, G, P, N, dtype=torch.bfloat16, seed=batch + 1)
    num_slots = batch + 8
    check_decode(mamba2_decode, mamba2_decode_ref, kw, cuda_pool(num_slots, H, P, N, dtype=torch.bfloat16),
                 batch_slots(batch, num_slots), num_slots - 1, state_tol=1e-2)


@pytest.mark.parametrize("batch", [1, 8, 64, 256])
def test_mamba1_decode_jamba_shape(batch):
    kw = mamba1_inputs(batch, DM, N1, with_dt_bias=False, dtype=torch.bfloat16, seed=batch)
    num_slots = batch + 8
    check_decode(mamba1_decode, mamba1_decode_ref, kw, cuda_pool(num_slots, DM, N1), batch_slots(batch, num_slots),
                 num_slots - 1, state_tol=1e-5)


@pytest.mark.parametrize("lens", [[300, 1, 77], [500]])  # launch configs of a few sequences and of one
def test_mamba1_prefill_jamba_shape(lens):
    slots, has_init = [4, 0, 2][: len(lens)], [True, False, True][: len(lens)]
    kw = mamba1_inputs(sum(lens), DM, N1, with_dt_bias=False, dtype=torch.bfloat16, seed=3)
    states = cuda_pool(6, DM, N1)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], device="cuda", dtype=torch.int32)
    args = dict(**kw, cu_seqlens=cu, state_slots=slots_tensor(slots),
                has_initial_state=torch.tensor(has_init, device="cuda"))
    ours, ref = states.clone(), states.clone()
    y = mamba1_prefill(**args, ssm_states=ours)
    y_ref = mamba1_prefill_ref(**args, ssm_states=ref)
    assert rel_err(y, y_ref) < 1e-2
    assert rel_err(ours, ref) < 1e-5
    untouched = [s for s in range(6) if s not in slots]
    assert torch.equal(ours[untouched], states[untouched])
