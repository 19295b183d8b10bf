"""gdn_decode (Triton) vs gdn_decode_ref, called by keyword with the same arguments.

CPU runs the Triton interpreter in float32 on tiny odd shapes. Inputs are strided views of one
projection row (as the model passes them); the state pool has a pad slot, batch rows use
unordered slots and some rows point at the pad slot.
"""

import pytest
import torch

from triton_kernels.gdn_recurrent import _gdn_decode_fwd, gdn_decode, gdn_decode_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def decode_inputs(batch, hk, hv, dk, dv, *, num_slots, dtype=torch.float32, seed=0, device=DEVICE):
    """Keyword arguments of gdn_decode for `batch` rows, without ssm_states / state_slots / pad_slot."""
    g = torch.Generator().manual_seed(seed)
    sizes = [hk * dk, hk * dk, hv * dv, hv, hv]
    proj = torch.randn(batch, sum(sizes) + 5, generator=g).to(device=device, dtype=dtype)  # rows wider than the parts
    q, k, v, b, a = proj[:, : sum(sizes)].split(sizes, dim=-1)
    return dict(
        q=q.view(batch, hk, dk), k=k.view(batch, hk, dk), v=v.view(batch, hv, dv), a=a, b=b,
        A_log=torch.empty(hv).uniform_(-3, 1, generator=g).to(device),
        dt_bias=torch.empty(hv).uniform_(-1, 1, generator=g).to(device),
    )


def pool(num_slots, hv, dk, dv, *, dtype=torch.float32, seed=1, device=DEVICE):
    g = torch.Generator().manual_seed(seed)
    return (0.5 * torch.randn(num_slots, hv, dk, dv, generator=g)).to(device=device, dtype=dtype)


def run_both(kwargs, states, slots, pad_slot):
    ours, ref = states.clone(), states.clone()
    o = gdn_decode(**kwargs, ssm_states=ours, state_slots=slots, pad_slot=pad_slot)
    o_ref = gdn_decode_ref(**kwargs, ssm_states=ref, state_slots=slots, pad_slot=pad_slot)
    return o, o_ref, ours, ref


@pytest.mark.parametrize("batch,hk,hv,dk,dv", [(1, 1, 1, 16, 16), (5, 2, 4, 32, 16), (7, 1, 3, 16, 32),
                                               (3, 2, 2, 32, 32)])
def test_decode_matches_ref(batch, hk, hv, dk, dv):
    num_slots = 9  # slot 8 is the pad slot
    kwargs = decode_inputs(batch, hk, hv, dk, dv, num_slots=num_slots)
    states = pool(num_slots, hv, dk, dv)
    slots = torch.tensor([6, 8, 0, 3, 8, 1, 7][:batch], device=DEVICE)
    o, o_ref, ours, ref = run_both(kwargs, states, slots, pad_slot=8)
    torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)  # every slot: updated ones and the rest
    assert (o[slots == 8] == 0).all()
    assert torch.equal(ours[8], states[8]), "the pad slot must not be written"


def test_decode_bf16_inputs_fp32_state():
    """The serving dtypes: bf16 projections, fp32 state pool."""
    kwargs = decode_inputs(4, 2, 4, 32, 16, num_slots=6, dtype=torch.bfloat16)
    states = pool(6, 4, 32, 16)
    o, o_ref, ours, ref = run_both(kwargs, states, torch.tensor([5, 0, 3, 2], device=DEVICE), pad_slot=5)
    assert o.dtype == torch.bfloat16
    torch.testing.assert_close(o, o_ref)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_decode_default_pad_and_scale():
    kwargs = decode_inputs(4, 1, 2, 16, 16, num_slots=4)
    states = pool(4, 2, 16, 16)
    slots = torch.tensor([2, -1, 0, 3], device=DEVICE, dtype=torch.int32)
    ours, ref = states.clone(), states.clone()
    o = gdn_decode(**kwargs, ssm_states=ours, state_slots=slots, scale=0.3)
    o_ref = gdn_decode_ref(**kwargs, ssm_states=ref, state_slots=slots, scale=0.3)
    torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    assert o[1].abs().max() == 0


def test_decode_all_rows_padded():
    kwargs = decode_inputs(3, 1, 2, 16, 16, num_slots=3)
    states = pool(3, 2, 16, 16)
    ours = states.clone()
    o = gdn_decode(**kwargs, ssm_states=ours, state_slots=torch.full((3,), 2, device=DEVICE), pad_slot=2)
    assert o.abs().max() == 0 and torch.equal(ours, states)


def test_decode_steps_carry_state():
    """Three decode steps in a row, each through the pool, match the reference step by step."""
    num_slots, hv = 6, 4
    states = pool(num_slots, hv, 16, 16)
    ours, ref = states.clone(), states.clone()
    slots = torch.tensor([4, 1, 5], device=DEVICE)
    for step in range(3):
        kwargs = decode_inputs(3, 2, hv, 16, 16, num_slots=num_slots, seed=10 + step)
        o = gdn_decode(**kwargs, ssm_states=ours, state_slots=slots, pad_slot=5)
        o_ref = gdn_decode_ref(**kwargs, ssm_states=ref, state_slots=slots, pad_slot=5)
        torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def rel_err(x, ref):
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 64, 256])
def test_decode_bf16_real_shapes(batch):
    """Qwen3.5-9B linear attention: 16 key heads, 32 value heads, K = V = 128; bf16 inputs, fp32 state."""
    num_slots = batch + 8
    kwargs = decode_inputs(batch, 16, 32, 128, 128, num_slots=num_slots, dtype=torch.bfloat16)
    states = pool(num_slots, 32, 128, 128)
    slots = torch.randperm(num_slots - 1, device=DEVICE)[:batch]
    if batch > 1:
        slots[batch // 2] = num_slots - 1  # one padded row
    o, o_ref, ours, ref = run_both(kwargs, states, slots, pad_slot=num_slots - 1)
    assert rel_err(o, o_ref) < 1e-2
    assert rel_err(ours, ref) < 1e-4


def norm_inputs(batch, hv, dv, *, dtype=torch.float32, seed=3, device=DEVICE):
    """z as a strided view of a wider projection row, the norm weight around 1."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(batch, hv * dv + 3, generator=g).to(device=device, dtype=dtype)[:, : hv * dv].view(batch, hv, dv)
    weight = (1 + 0.3 * torch.randn(dv, generator=g)).to(device=device, dtype=dtype)
    return dict(z=z, norm_weight=weight, norm_eps=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)])
@pytest.mark.parametrize("batch,hk,hv,dk,dv", [(3, 1, 2, 16, 16), (4, 2, 4, 16, 32), (2, 1, 3, 32, 24)])
@pytest.mark.parametrize("by_last_below", [0, 128], ids=["whole_heads", "last_program"])
def test_decode_with_gated_norm_matches_ref(batch, hk, hv, dk, dv, dtype, by_last_below, monkeypatch):
    """The gated RMSNorm fused into the decode kernel equals gdn_decode_ref then gated_rmsnorm_ref (odd V
    included: the head is one masked block), states as without the norm, padded rows 0, both ways it is
    served (a program per whole head, or narrow blocks normalized by the head's last program). (bf16 on
    CUDA only: the interpreter's bf16 arithmetic is wrong, the unfused norm kernel's too.)"""
    import triton_kernels.gdn_recurrent as gdn

    monkeypatch.setattr(gdn, "NORM_BY_LAST_PROGRAM_MAX_ROWS", by_last_below)
    num_slots = 6
    kwargs = {**decode_inputs(batch, hk, hv, dk, dv, num_slots=num_slots, dtype=dtype),
              **norm_inputs(batch, hv, dv, dtype=dtype)}
    states = pool(num_slots, hv, dk, dv)
    slots = torch.tensor([4, 5, 0, 2][:batch], device=DEVICE)
    o, o_ref, ours, ref = run_both(kwargs, states, slots, pad_slot=5)
    assert o.dtype == dtype and o.shape == (batch, hv, dv)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(o, o_ref, **tol)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    assert (o[1] == 0).all() and torch.equal(ours[5], states[5])


@pytest.mark.parametrize("dv,bv", [(32, 16), (24, 8)])
def test_decode_norm_by_the_heads_last_program_matches_ref(dv, bv):
    """V in blocks of bv (as served at small batches), the head's last program to arrive normalizing the
    row its blocks wrote; the same result as the reference, every counter back at 0."""
    from triton_kernels.arrival_counters import arrival_counters

    batch, hv = 3, 2
    kwargs = {**decode_inputs(batch, 1, hv, 16, dv, num_slots=5), **norm_inputs(batch, hv, dv)}
    states = pool(5, hv, 16, dv)
    slots = torch.tensor([3, 4, 0], device=DEVICE)
    ours, ref = states.clone(), states.clone()
    o = _gdn_decode_fwd(**kwargs, ssm_states=ours, state_slots=slots, pad_slot=4, scale=0.25, BV=bv, num_warps=1)
    o_ref = gdn_decode_ref(**kwargs, ssm_states=ref, state_slots=slots, pad_slot=4, scale=0.25)
    torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    assert (o[1] == 0).all()
    assert int(arrival_counters(o.device, batch * hv)[: batch * hv].abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 8, 64, 256])
def test_decode_with_gated_norm_bf16_real_shapes(batch):
    """Qwen3.5-9B linear attention with the fused norm, bf16: the unfused kernel followed by the served gated
    norm kernel, up to rounding, and close to the float32 reference. The two paths sum o in another order (a
    whole head per program against narrow tiles) and each rounds four times (o, the normalized row, its product
    with the weight, the output), each rounding within 2^-8 of the exact value, so the two may be 8 * 2^-8 = 2^-5
    apart, relative. The default bf16 rtol (1.6e-2) is not a bound: at batch 64 on the H200 one element of
    262144 was 1.8e-2 apart."""
    from triton_kernels.norms import gated_rmsnorm
    num_slots = batch + 8
    base = decode_inputs(batch, 16, 32, 128, 128, num_slots=num_slots, dtype=torch.bfloat16)
    norm = norm_inputs(batch, 32, 128, dtype=torch.bfloat16)
    states = pool(num_slots, 32, 128, 128)
    slots = torch.randperm(num_slots - 1, device=DEVICE)[:batch]
    fused_states, split_states = states.clone(), states.clone()
    fused = gdn_decode(**base, **norm, ssm_states=fused_states, state_slots=slots, pad_slot=num_slots - 1)
    o = gdn_decode(**base, ssm_states=split_states, state_slots=slots, pad_slot=num_slots - 1)
    split = gated_rmsnorm(x=o, z=norm["z"], weight=norm["norm_weight"], eps=norm["norm_eps"])
    torch.testing.assert_close(fused_states, split_states, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused, split, rtol=2**-5, atol=1e-5)
    ref = gdn_decode_ref(**base, **norm, ssm_states=states.clone(), state_slots=slots, pad_slot=num_slots - 1)
    assert rel_err(fused, ref) < 1e-2
