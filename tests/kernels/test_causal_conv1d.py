"""causal_conv1d_prefill / causal_conv1d_update (Triton) vs their references, called by keyword.

CPU runs the Triton interpreter in float32. x is a strided view (a slice of a wider projection
row, as the model passes it); conv states live in a pool with unordered slots; sequences are
shorter and longer than the width and than a chunk (64 tokens).
"""

import pytest
import torch

from triton_kernels.causal_conv1d import (
    causal_conv1d_prefill,
    causal_conv1d_prefill_ref,
    causal_conv1d_update,
    causal_conv1d_update_ref,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def strided_x(num_tokens, dim, *, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(num_tokens, dim + 7, generator=g).to(device=DEVICE, dtype=dtype)[:, 3 : 3 + dim]


def conv_params(dim, width, *, bias=True, dtype=torch.float32, num_slots=8, seed=1):
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(dim, width, generator=g) / width).to(device=DEVICE, dtype=dtype)
    b = torch.randn(dim, generator=g).to(device=DEVICE, dtype=dtype) if bias else None
    states = torch.randn(num_slots, width - 1, dim, generator=g).to(device=DEVICE, dtype=dtype)
    return weight, b, states


def varlen(lens):
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    return cu.to(DEVICE)


def prefill_both(x, weight, bias, states, lens, slots, has_init, activation="silu"):
    kwargs = dict(x=x, weight=weight, bias=bias, cu_seqlens=varlen(lens), activation=activation,
                  state_slots=torch.tensor(slots, device=DEVICE),
                  has_initial_state=torch.tensor(has_init, device=DEVICE))
    ours, ref = states.clone(), states.clone()
    y = causal_conv1d_prefill(**kwargs, conv_states=ours)
    y_ref = causal_conv1d_prefill_ref(**kwargs, conv_states=ref)
    return y, y_ref, ours, ref


@pytest.mark.parametrize("lens,width", [([1], 4), ([5], 4), ([64], 4), ([65, 2, 130], 4), ([3, 1, 63, 2], 4),
                                        ([70, 1, 9], 3), ([2, 40], 2)])
def test_prefill_matches_ref(lens, width):
    dim = 40
    x = strided_x(sum(lens), dim)
    weight, bias, states = conv_params(dim, width)
    slots = [5, 0, 7, 2][: len(lens)]
    has_init = [True, False, True, True][: len(lens)]
    y, y_ref, ours, ref = prefill_both(x, weight, bias, states, lens, slots, has_init)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=0, rtol=0)


@pytest.mark.parametrize("bias,activation", [(False, "silu"), (True, None)])
def test_prefill_bias_and_activation(bias, activation):
    lens, dim = [7, 66], 24
    x = strided_x(sum(lens), dim, seed=3)
    weight, b, states = conv_params(dim, 4, bias=bias)
    y, y_ref, ours, ref = prefill_both(x, weight, b, states, lens, [1, 4], [True, False], activation)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=0, rtol=0)


def test_prefill_bf16():
    """The model's dtype: bf16 input and conv state (the state rows are copies, so exact)."""
    lens, dim = [3, 70, 1], 40
    x = strided_x(sum(lens), dim, dtype=torch.bfloat16)
    weight, bias, states = conv_params(dim, 4, dtype=torch.bfloat16)
    y, y_ref, ours, ref = prefill_both(x, weight, bias, states, lens, [1, 4, 2], [True, True, False])
    torch.testing.assert_close(y, y_ref)
    assert torch.equal(ours, ref)


def test_prefill_ignores_states_without_initial_state():
    """A slot without an initial state may hold anything (NaN here): it must not be read."""
    lens, dim = [2, 5], 16
    x = strided_x(sum(lens), dim)
    weight, bias, states = conv_params(dim, 4)
    states[3] = float("nan")
    y, y_ref, ours, ref = prefill_both(x, weight, bias, states, lens, [3, 6], [False, True])
    assert torch.isfinite(y).all() and torch.isfinite(ours[3]).all()
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=0, rtol=0)


@pytest.mark.parametrize("width,dtype", [(4, torch.float32), (2, torch.float32), (4, torch.bfloat16)])
def test_update_matches_ref(width, dtype):
    dim, num_slots = 40, 8
    weight, bias, states = conv_params(dim, width, num_slots=num_slots, dtype=dtype)
    slots = torch.tensor([5, 7, 0, 7, 2], device=DEVICE)  # 7 is the pad slot
    ours, ref = states.clone(), states.clone()
    for step in range(2):
        x = strided_x(5, dim, seed=20 + step, dtype=dtype)
        kwargs = dict(x=x, weight=weight, bias=bias, state_slots=slots, pad_slot=7)
        y = causal_conv1d_update(**kwargs, conv_states=ours)
        y_ref = causal_conv1d_update_ref(**kwargs, conv_states=ref)
        torch.testing.assert_close(y, y_ref, **({} if dtype == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)))
        assert (y[slots == 7] == 0).all()
    torch.testing.assert_close(ours, ref, atol=0, rtol=0)
    assert torch.equal(ours[7], states[7])


def test_update_default_pad_no_bias():
    dim = 24
    weight, _, states = conv_params(dim, 4, num_slots=4)
    x = strided_x(3, dim)
    slots = torch.tensor([-1, 3, 0], device=DEVICE, dtype=torch.int32)
    ours, ref = states.clone(), states.clone()
    y = causal_conv1d_update(x=x, weight=weight, bias=None, conv_states=ours, state_slots=slots, activation=None)
    y_ref = causal_conv1d_update_ref(x=x, weight=weight, bias=None, conv_states=ref, state_slots=slots,
                                     activation=None)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=0, rtol=0)


@pytest.mark.parametrize("split", [1, 2, 64, 70])
def test_prefill_pieces_then_decode(split):
    """Serving: a prompt prefilled in two pieces (the second continues from the slot), then one
    decode step, equals the reference prefill over the whole prompt plus that token."""
    dim, total = 24, 72
    x = strided_x(total + 1, dim, seed=5)
    weight, bias, states = conv_params(dim, 4)
    ref = states.clone()
    y_ref = causal_conv1d_prefill_ref(x=x, weight=weight, bias=bias, conv_states=ref, cu_seqlens=varlen([total + 1]),
                                      state_slots=torch.tensor([6], device=DEVICE),
                                      has_initial_state=torch.tensor([False], device=DEVICE))
    ours, ys = states.clone(), []
    for start, end, init in ((0, split, False), (split, total, True)):
        ys.append(causal_conv1d_prefill(x=x[start:end], weight=weight, bias=bias, conv_states=ours,
                                        cu_seqlens=varlen([end - start]), state_slots=torch.tensor([6], device=DEVICE),
                                        has_initial_state=torch.tensor([init], device=DEVICE)))
    ys.append(causal_conv1d_update(x=x[total:], weight=weight, bias=bias, conv_states=ours,
                                   state_slots=torch.tensor([6], device=DEVICE)))
    torch.testing.assert_close(torch.cat(ys), y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=0, rtol=0)


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


SNAP_SLOTS = [17, 8, 11, 1, 13, 9, 3, 12, 10, 14, 16, 15, 19]  # unordered pool rows for snapshots


@pytest.mark.parametrize("width", [2, 3, 4])
def test_prefill_snapshots(width):
    """Snapshots at p = 1, below the width (reaching into the initial state or zeros), at chunk ends,
    inside chunks and at the sequence end, beside a sequence without cuts: kernel == reference
    (copies, so exact); the cuts leave the outputs and every other pool row as they were; and the
    reference's snapshot at p is the final state of a run over the first p tokens."""
    dim, pad_slot = 24, 5
    lens = [1, 5, 63, 64, 130]
    has_init = [True, True, False, True, False]
    state_slots = [4, 0, 6, 2, 7]
    cuts = [[1], [1, 2, 5], [], [3, 63, 64], [1, 2, 64, 65, 127, 130]]
    x = strided_x(sum(lens), dim, seed=21)
    weight, bias, states = conv_params(dim, width, num_slots=20)
    kwargs = dict(x=x, weight=weight, bias=bias, cu_seqlens=varlen(lens),
                  state_slots=torch.tensor(state_slots, device=DEVICE),
                  has_initial_state=torch.tensor(has_init, device=DEVICE))
    snaps = snap_args(cuts, SNAP_SLOTS, pad_slot)
    plain, ours, ref = states.clone(), states.clone(), states.clone()
    y_plain = causal_conv1d_prefill(**kwargs, conv_states=plain)
    y = causal_conv1d_prefill(**kwargs, **snaps, conv_states=ours)
    y_ref = causal_conv1d_prefill_ref(**kwargs, **snaps, conv_states=ref)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours, ref, atol=0, rtol=0)

    written = SNAP_SLOTS[: sum(map(len, cuts))]
    others = [i for i in range(states.shape[0]) if i not in written]
    assert torch.equal(y, y_plain) and torch.equal(ours[others], plain[others])
    assert torch.equal(ours[pad_slot], states[pad_slot])

    free, start = iter(written), 0
    for length, init, slot, seq_cuts in zip(lens, has_init, state_slots, cuts):
        for p in seq_cuts:
            prefix = states.clone()
            causal_conv1d_prefill_ref(x=x[start : start + p], weight=weight, bias=bias, conv_states=prefix,
                                      cu_seqlens=varlen([p]), state_slots=torch.tensor([slot], device=DEVICE),
                                      has_initial_state=torch.tensor([init], device=DEVICE))
            assert torch.equal(ref[next(free)], prefix[slot])
        start += length


@pytest.mark.parametrize("cut", [1, 2, 64, 70])
def test_prefill_continues_from_snapshot(cut):
    """Serving: a snapshot at p, then a prefill of the remaining tokens from that slot, gives the
    outputs and the final conv state of the uncut run."""
    dim, total = 24, 72
    x = strided_x(total, dim, seed=23)
    weight, bias, whole = conv_params(dim, 4)
    y_whole = causal_conv1d_prefill(x=x, weight=weight, bias=bias, conv_states=whole, cu_seqlens=varlen([total]),
                                    state_slots=torch.tensor([6], device=DEVICE),
                                    has_initial_state=torch.tensor([True], device=DEVICE),
                                    **snap_args([[cut]], [3], 0))
    resumed = whole.clone()
    y_rest = causal_conv1d_prefill(x=x[cut:], weight=weight, bias=bias, conv_states=resumed,
                                   cu_seqlens=varlen([total - cut]), state_slots=torch.tensor([3], device=DEVICE),
                                   has_initial_state=torch.tensor([True], device=DEVICE))
    torch.testing.assert_close(y_rest, y_whole[cut:], atol=1e-5, rtol=1e-5)
    assert torch.equal(resumed[3], whole[6])


@pytest.mark.gpu
@pytest.mark.parametrize("lens", [[4096], [1, 3, 100, 2000]])
def test_conv_bf16_real_shapes(lens):
    """Qwen3.5-9B conv over [q k v]: 8192 channels, width 4, bf16."""
    dim = 8192
    x = strided_x(sum(lens), dim, dtype=torch.bfloat16)
    weight, bias, states = conv_params(dim, 4, bias=False, dtype=torch.bfloat16, num_slots=16)
    slots = [9, 2, 15, 4][: len(lens)]
    y, y_ref, ours, ref = prefill_both(x, weight, None, states, lens, slots, [True, False, True, True][: len(lens)])
    torch.testing.assert_close(y, y_ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(ours, ref, atol=0, rtol=0)
    xd = strided_x(len(lens), dim, dtype=torch.bfloat16, seed=9)
    kwargs = dict(x=xd, weight=weight, bias=None, state_slots=torch.tensor(slots, device=DEVICE), pad_slot=15)
    torch.testing.assert_close(causal_conv1d_update(**kwargs, conv_states=ours),
                               causal_conv1d_update_ref(**kwargs, conv_states=ref), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(ours, ref, atol=0, rtol=0)
