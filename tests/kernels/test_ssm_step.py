"""SSM decode steps: the references against closed forms and the prefill references, then
mamba2_decode / mamba1_decode (Triton) against the references, called by keyword.

CPU runs the Triton interpreter in float32 on tiny odd shapes. Inputs are strided views of one
projection row (as the model passes them); the state pool has a pad slot, batch rows use
unordered slots and some rows point at the pad slot.
"""

import torch
import torch.nn.functional as F

from triton_kernels.ssd_chunk import mamba2_prefill_ref
from triton_kernels.ssm_step import mamba1_decode_ref, mamba2_decode_ref

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
