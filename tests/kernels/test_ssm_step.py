"""SSM decode steps: the references against closed forms and the prefill references, then
mamba2_decode / mamba1_decode (Triton) against the references, called by keyword.

CPU runs the Triton interpreter in float32 on tiny odd shapes. Inputs are strided views of one
projection row (as the model passes them); the state pool has a pad slot, batch rows use
unordered slots and some rows point at the pad slot.
"""

import pytest
import torch
import torch.nn.functional as F

from triton_kernels.ssd_chunk import mamba2_prefill_ref
from triton_kernels.ssm_step import mamba1_decode, mamba1_decode_ref, mamba2_decode, mamba2_decode_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def mamba2_inputs(batch, heads, groups, head_dim, state, *, gated=True, dtype=torch.float32, seed=0):
    """Keyword arguments of mamba2_decode for `batch` rows (or tokens), without the pool and slots.
    x, z, B, C, dt are slices of one projection row that starts 3 elements into its buffer."""
    g = torch.Generator().manual_seed(seed)
    sizes = [heads * head_dim, heads * head_dim, groups * state, groups * state, heads]
    proj = torch.randn(batch, sum(sizes) + 3, generator=g).to(device=DEVICE, dtype=dtype)
    z, x, B, C, dt = proj[:, 3:].split(sizes, dim=-1)
    return dict(
        x=x.view(batch, heads, head_dim), dt=dt,
        A_log=torch.empty(heads).uniform_(-1, 1.5, generator=g).to(DEVICE),
        B=B.view(batch, groups, state), C=C.view(batch, groups, state),
        D=torch.randn(heads, generator=g).to(DEVICE),
        dt_bias=torch.empty(heads).uniform_(-1, 1, generator=g).to(DEVICE),
        z=z.view(batch, heads, head_dim) if gated else None,
    )


def mamba1_inputs(batch, dim, state, *, gated=True, with_dt_bias=True, dtype=torch.float32, seed=0):
    """Keyword arguments of mamba1_decode for `batch` rows (or tokens), without the pool and slots.
    x and z are slices of one in_proj row; dt, B, C of one x_proj row (after its dt_rank columns)."""
    g = torch.Generator().manual_seed(seed)
    xz = torch.randn(batch, 2 * dim + 1, generator=g).to(device=DEVICE, dtype=dtype)
    dbc = torch.randn(batch, 5 + dim + 2 * state, generator=g).to(device=DEVICE, dtype=dtype)
    dt, B, C = dbc[:, 5:].split([dim, state, state], dim=-1)
    return dict(
        x=xz[:, 1 : dim + 1], dt=dt,
        A_log=torch.empty(dim, state).uniform_(-1, 1.5, generator=g).to(DEVICE),
        B=B, C=C, D=torch.randn(dim, generator=g).to(DEVICE),
        dt_bias=torch.empty(dim).uniform_(-1, 1, generator=g).to(DEVICE) if with_dt_bias else None,
        z=xz[:, dim + 1 :] if gated else None,
    )


def state_pool(num_slots, *shape, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (0.5 * torch.randn(num_slots, *shape, generator=g)).to(device=DEVICE, dtype=dtype)


def rows(kwargs, index):
    """The per-token (per-row) inputs of kwargs at `index` (an int, slice or index tensor)."""
    per_row = ("x", "dt", "B", "C", "z")
    return {k: (v[index] if k in per_row and v is not None else v) for k, v in kwargs.items()}


def slots_tensor(slots):
    return torch.tensor(slots, device=DEVICE, dtype=torch.int32)


# ---------------------------------------------------------------- references


def test_mamba2_ref_first_step_closed_form():
    """From a zero state one step gives s = dt x (outer) B_g and y = dt x (B_g . C_g) + D x, gated by
    silu(z); head h reads group h // (H / G)."""
    H, G, P, N = 6, 3, 5, 7
    kw = mamba2_inputs(2, H, G, P, N)
    states = state_pool(4, H, P, N)
    states[2] = 0.0
    y = mamba2_decode_ref(**kw, ssm_states=states, state_slots=slots_tensor([2, -1]))
    dt = F.softplus(kw["dt"][0] + kw["dt_bias"])  # [H]
    group = torch.arange(H, device=DEVICE) // (H // G)
    B, C, x = kw["B"][0, group], kw["C"][0, group], kw["x"][0]  # [H, N], [H, N], [H, P]
    expect_state = (dt[:, None] * x)[..., None] * B[:, None, :]
    expect_y = (dt[:, None] * x) * (B * C).sum(-1)[:, None] + kw["D"][:, None] * x
    expect_y = expect_y * kw["z"][0] * torch.sigmoid(kw["z"][0])
    torch.testing.assert_close(states[2], expect_state)
    torch.testing.assert_close(y[0], expect_y)
    assert (y[1] == 0).all()


def test_mamba2_ref_decay_and_dt_limit():
    """With x = 0 the state only decays, by exp(-exp(A_log) * clamp(softplus(dt + dt_bias)))."""
    H, P, N = 4, 3, 5
    kw = mamba2_inputs(1, H, 1, P, N, gated=False)
    kw["x"] = torch.zeros_like(kw["x"])
    states = state_pool(2, H, P, N)
    before = states[1].clone()
    y = mamba2_decode_ref(**kw, ssm_states=states, state_slots=slots_tensor([1]), dt_limit=(0.2, 0.5))
    dt = F.softplus(kw["dt"][0] + kw["dt_bias"]).clamp(0.2, 0.5)
    decay = torch.exp(-dt * kw["A_log"].exp())
    torch.testing.assert_close(states[1], before * decay[:, None, None])
    torch.testing.assert_close(y[0], torch.einsum("hpn,n->hp", states[1], kw["C"][0, 0]))


def test_mamba1_ref_first_step_closed_form():
    Dm, N = 6, 5
    kw = mamba1_inputs(2, Dm, N)
    states = state_pool(3, Dm, N)
    states[0] = 0.0
    y = mamba1_decode_ref(**kw, ssm_states=states, state_slots=slots_tensor([-1, 0]))
    dt = F.softplus(kw["dt"][1] + kw["dt_bias"])  # [Dm]
    x, B, C = kw["x"][1], kw["B"][1], kw["C"][1]
    torch.testing.assert_close(states[0], (dt * x)[:, None] * B[None, :])
    expect_y = dt * x * (B * C).sum() + kw["D"] * x
    torch.testing.assert_close(y[1], expect_y * F.silu(kw["z"][1]))
    assert (y[0] == 0).all()


def test_mamba1_ref_per_channel_decay_without_dt_bias():
    Dm, N = 4, 3
    kw = mamba1_inputs(1, Dm, N, gated=False, with_dt_bias=False)
    kw["x"] = torch.zeros_like(kw["x"])
    states = state_pool(1, Dm, N)
    before = states[0].clone()
    mamba1_decode_ref(**kw, ssm_states=states, state_slots=slots_tensor([0]))
    dt = F.softplus(kw["dt"][0])
    torch.testing.assert_close(states[0], before * torch.exp(-dt[:, None] * kw["A_log"].exp()))


def test_mamba2_ref_decode_continues_prefill():
    """The serving invariant between the references: prefill T tokens, then decode token by token
    from the slot == one prefill over all tokens (outputs of the decoded tokens and final state)."""
    H, G, P, N, T, extra = 4, 2, 3, 5, 6, 3
    kw = mamba2_inputs(T + extra, H, G, P, N)
    states = state_pool(3, H, P, N)
    one, split = states.clone(), states.clone()
    cu = torch.tensor([0, T + extra], device=DEVICE, dtype=torch.int32)
    y_all = mamba2_prefill_ref(**kw, ssm_states=one, cu_seqlens=cu, state_slots=slots_tensor([1]),
                               has_initial_state=torch.tensor([True], device=DEVICE), chunk_size=4)
    mamba2_prefill_ref(**rows(kw, slice(0, T)), ssm_states=split, cu_seqlens=cu.clamp(max=T),
                       state_slots=slots_tensor([1]), has_initial_state=torch.tensor([True], device=DEVICE))
    for t in range(T, T + extra):
        y = mamba2_decode_ref(**rows(kw, slice(t, t + 1)), ssm_states=split, state_slots=slots_tensor([1]))
        torch.testing.assert_close(y[0], y_all[t])
    torch.testing.assert_close(split, one)


# ---------------------------------------------------------------- Triton vs references


def run_both(kernel, ref, kwargs, states, slots, pad_slot=-1, **extra):
    """(y, y_ref, states after ours, states after the reference), from the same starting pool."""
    ours, theirs = states.clone(), states.clone()
    slots = slots_tensor(slots)
    y = kernel(**kwargs, ssm_states=ours, state_slots=slots, pad_slot=pad_slot, **extra)
    y_ref = ref(**kwargs, ssm_states=theirs, state_slots=slots, pad_slot=pad_slot, **extra)
    return y, y_ref, ours, theirs


def check_pad_rows(y, ours, states, slots, pad_slot):
    padded = torch.tensor([s == pad_slot for s in slots], device=DEVICE)
    assert (y[padded] == 0).all(), "padded rows must give zeros"
    if 0 <= pad_slot < states.shape[0]:
        assert torch.equal(ours[pad_slot], states[pad_slot]), "the pad slot must not be written"


@pytest.mark.parametrize("batch,H,G,P,N,gated", [(1, 1, 1, 4, 8, True), (5, 4, 2, 6, 12, True), (7, 6, 1, 5, 16, False),
                                                 (3, 3, 3, 16, 7, True), (4, 8, 4, 3, 32, False)])
def test_mamba2_decode_matches_ref(batch, H, G, P, N, gated):
    """Odd P and N (masked tiles), grouped B/C, strided inputs, unordered slots, padded rows (slot 8)."""
    kw = mamba2_inputs(batch, H, G, P, N, gated=gated, seed=batch)
    states = state_pool(9, H, P, N)
    slots = [6, 8, 0, 3, 8, 1, 7][:batch]
    y, y_ref, ours, ref = run_both(mamba2_decode, mamba2_decode_ref, kw, states, slots, pad_slot=8)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)  # every slot: the updated ones and the rest
    check_pad_rows(y, ours, states, slots, 8)


def test_mamba2_decode_dt_limit_and_default_pad():
    kw = mamba2_inputs(4, 4, 2, 5, 9, seed=3)
    kw["dt"] = kw["dt"] * 4  # spread dt over both sides of the limits
    states = state_pool(5, 4, 5, 9)
    slots = [2, -1, 0, 4]
    y, y_ref, ours, ref = run_both(mamba2_decode, mamba2_decode_ref, kw, states, slots, dt_limit=(0.3, 1.5))
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    check_pad_rows(y, ours, states, slots, -1)


def test_mamba2_decode_softplus_extremes():
    """dt + dt_bias far below 0 (softplus ~ exp, small) and above torch's threshold of 20 (identity)."""
    kw = mamba2_inputs(3, 2, 1, 4, 8, seed=5)
    kw["dt"] = torch.tensor([[-12.0, -3.0], [0.5, 19.5], [21.0, 40.0]], device=DEVICE)
    kw["dt_bias"] = torch.zeros(2, device=DEVICE)
    kw["A_log"] = torch.full((2,), -6.0, device=DEVICE)  # slow decay, so a large dt keeps the state finite
    states = state_pool(3, 2, 4, 8)
    y, y_ref, ours, ref = run_both(mamba2_decode, mamba2_decode_ref, kw, states, [2, 0, 1])
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_mamba2_decode_all_rows_padded():
    kw = mamba2_inputs(3, 2, 1, 4, 8)
    states = state_pool(3, 2, 4, 8)
    ours = states.clone()
    y = mamba2_decode(**kw, ssm_states=ours, state_slots=slots_tensor([2, 2, 2]), pad_slot=2)
    assert y.abs().max() == 0 and torch.equal(ours, states)


@pytest.mark.parametrize("inputs,pool", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
def test_mamba2_decode_dtypes(inputs, pool):
    """bf16 projections with an fp32 pool (the serving default), and a bf16 pool (cast on load and store)."""
    kw = mamba2_inputs(4, 4, 2, 8, 16, dtype=inputs, seed=7)
    states = state_pool(6, 4, 8, 16, dtype=pool)
    y, y_ref, ours, ref = run_both(mamba2_decode, mamba2_decode_ref, kw, states, [5, 0, 3, 2], pad_slot=5)
    assert y.dtype == inputs and ours.dtype == pool
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(ours, ref)
    assert torch.equal(ours[[1, 4, 5]], states[[1, 4, 5]])


def varlen(lens):
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    return cu.to(DEVICE)


def test_mamba2_decode_continues_prefill():
    """The serving invariant: prefill the first tokens of each sequence (reference), then decode the rest
    token by token with the kernel (two requests in unordered slots and a padded row in each step) ==
    one prefill over the whole sequences: outputs of the decoded tokens and final states."""
    H, G, P, N = 4, 2, 6, 12
    lens, decoded, slots = [9, 5], 3, [3, 1]
    kw = mamba2_inputs(sum(lens), H, G, P, N, seed=20)
    states = state_pool(5, H, P, N)
    whole, split = states.clone(), states.clone()
    init = torch.tensor([True, False], device=DEVICE)
    y_all = mamba2_prefill_ref(**kw, ssm_states=whole, cu_seqlens=varlen(lens), state_slots=slots_tensor(slots),
                               has_initial_state=init)
    bos = [0, lens[0]]
    head = [n - decoded for n in lens]
    first = torch.cat([torch.arange(b, b + h) for b, h in zip(bos, head)]).to(DEVICE)
    mamba2_prefill_ref(**rows(kw, first), ssm_states=split, cu_seqlens=varlen(head), state_slots=slots_tensor(slots),
                       has_initial_state=init)
    for step in range(decoded):
        t = [b + h + step for b, h in zip(bos, head)]
        y = mamba2_decode(**rows(kw, torch.tensor([t[0], t[0], t[1]], device=DEVICE)), ssm_states=split,
                          state_slots=slots_tensor([slots[0], -1, slots[1]]))
        torch.testing.assert_close(y[[0, 2]], y_all[t], atol=1e-5, rtol=1e-5)
        assert (y[1] == 0).all()
    torch.testing.assert_close(split, whole, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch,Dm,N,gated,with_dt_bias", [(1, 8, 4, True, True), (5, 20, 16, True, False),
                                                           (3, 33, 7, False, True), (6, 300, 16, False, False)])
def test_mamba1_decode_matches_ref(batch, Dm, N, gated, with_dt_bias):
    """Odd Dm and N (masked tiles), dt_bias None (folded into dt_proj), strided inputs, padded rows."""
    kw = mamba1_inputs(batch, Dm, N, gated=gated, with_dt_bias=with_dt_bias, seed=batch)
    states = state_pool(9, Dm, N)
    slots = [6, 8, 0, 3, 8, 1][:batch]
    y, y_ref, ours, ref = run_both(mamba1_decode, mamba1_decode_ref, kw, states, slots, pad_slot=8)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    check_pad_rows(y, ours, states, slots, 8)


@pytest.mark.parametrize("inputs,pool", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16)])
def test_mamba1_decode_dtypes(inputs, pool):
    kw = mamba1_inputs(4, 24, 16, dtype=inputs, seed=8)
    states = state_pool(5, 24, 16, dtype=pool)
    y, y_ref, ours, ref = run_both(mamba1_decode, mamba1_decode_ref, kw, states, [4, 0, -1, 2])
    assert y.dtype == inputs and ours.dtype == pool
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(ours, ref)
    check_pad_rows(y, ours, states, [4, 0, -1, 2], -1)


def test_mamba1_decode_steps_carry_state():
    """Three decode steps in a row through the pool match the reference step by step."""
    states = state_pool(6, 12, 5)
    ours, ref = states.clone(), states.clone()
    slots = slots_tensor([4, 1, 5])
    for step in range(3):
        kw = mamba1_inputs(3, 12, 5, seed=10 + step)
        y = mamba1_decode(**kw, ssm_states=ours, state_slots=slots, pad_slot=5)
        y_ref = mamba1_decode_ref(**kw, ssm_states=ref, state_slots=slots, pad_slot=5)
        torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
