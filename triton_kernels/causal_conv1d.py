"""Depthwise causal conv1d over packed varlen tokens, with per-request conv state in a pool.

Conv state pool layout: `[num_slots, width - 1, dim]` (the last `width - 1` inputs of each
request, oldest first). Prefill reads the initial state of each sequence from its slot when
`has_initial_state`, and writes the final state back into the slot. Decode updates in place.
Prefill also writes prefix-cache snapshots: the conv state after p tokens, in the same layout,
into the slots that snap_pos / snap_slots name.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.host_math import cdiv, next_power_of_2
from triton_kernels.varlen import locate_chunk, num_virtual_chunks, snapshot_cuts


@triton.jit
def _last_inputs(p_x, p_s, end, first, rows, stride_x_t, o_d, m_d, D: tl.constexpr, W: tl.constexpr,
                 BW: tl.constexpr):
    """[BW, BD]: the conv state after the first `end` tokens of a sequence, and its rows' mask. Row
    j < rows (<= W - 1) holds the input at position end - (W - 1) + j: from x (p_x: the sequence's
    first row) at positions >= 0, from the initial state (p_s: the slot) in [first, 0), else zero."""
    o_j = tl.arange(0, BW)
    o_f = end - (W - 1) + o_j
    m_j = (o_j < rows)[:, None] & m_d[None, :]
    m_fx = m_j & (o_f >= 0)[:, None]
    m_fs = m_j & ((o_f < 0) & (o_f >= first))[:, None]
    b_f = tl.load(p_x + o_f[:, None] * stride_x_t + o_d[None, :], mask=m_fx, other=0.0).to(tl.float32)
    b_f += tl.load(p_s + (o_f + W - 1)[:, None] * D + o_d[None, :], mask=m_fs, other=0.0).to(tl.float32)
    return b_f, m_j


@cached_launch
@triton.jit(do_not_specialize=["N", "C"])
def _causal_conv1d_prefill_kernel(
    x,
    weight,
    bias,
    conv_states,
    cu_seqlens,
    state_slots,
    has_initial_state,
    snap_pos,
    snap_slots,
    y,
    stride_x_t,
    stride_s,
    N,
    C,
    D: tl.constexpr,
    W: tl.constexpr,
    BT: tl.constexpr,
    BD: tl.constexpr,
    BW: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    USE_SILU: tl.constexpr,
    HAS_SNAP: tl.constexpr,
):
    """One program per (channel block, chunk of BT tokens of one sequence). Taps that reach before
    the sequence start read the slot's conv state (or zeros). The program holding a sequence's
    first chunk also writes its final conv state: it is the only reader of the initial one.
    With HAS_SNAP, the program of the chunk holding token p - 1 writes the snapshot of each cut p
    (snap_pos, snap_slots [N, C]): the last W - 1 inputs, which reach into the initial state only
    for p < W - 1, in the first chunk, so before the final state overwrites it."""
    i_d, i_c = tl.program_id(0), tl.program_id(1)
    i_n, i_t, bos, eos = locate_chunk(cu_seqlens, i_c, N, BT, BLOCK_N)
    length = eos - bos
    if (i_t > 0) & (i_t * BT >= length):
        return
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    t0 = i_t * BT  # the chunk's first position in the sequence
    o_c = tl.arange(0, BT)
    m_c = o_c < length - t0
    slot = tl.load(state_slots + i_n).to(tl.int64)
    # rows (relative to the chunk) that taps may read from x: from 0 in the first chunk, else from 1 - W;
    # from the conv state: [first, 0) of the first chunk, first = 1 - W with an initial state, else 0.
    # Flags enter masks as bounds: the interpreter cannot broadcast a scalar bool into a mask.
    x_from = (1 - W) * (i_t > 0).to(tl.int32)
    first = (1 - W) * (tl.load(has_initial_state + i_n) != 0).to(tl.int32)
    p_x = x + (bos + t0) * stride_x_t
    p_s = conv_states + slot * stride_s

    b_y = tl.zeros([BT, BD], dtype=tl.float32)
    if HAS_BIAS:
        b_y += tl.load(bias + o_d, mask=m_d, other=0.0).to(tl.float32)[None, :]
    for j in tl.static_range(W):
        o_p = o_c + (j - (W - 1))  # row of tap j; below 0 in the first chunk: row o_p + W - 1 of the state
        m_x = (m_c & (o_p >= x_from))[:, None] & m_d[None, :]
        b_in = tl.load(p_x + o_p[:, None] * stride_x_t + o_d[None, :], mask=m_x, other=0.0).to(tl.float32)
        if i_t == 0:
            m_s = (m_c & (o_p < 0) & (o_p >= first))[:, None] & m_d[None, :]
            p_in = p_s + (o_p + W - 1)[:, None] * D + o_d[None, :]
            b_in += tl.load(p_in, mask=m_s, other=0.0).to(tl.float32)
        b_y += b_in * tl.load(weight + o_d * W + j, mask=m_d, other=0.0).to(tl.float32)[None, :]
    if USE_SILU:
        b_y = b_y * tl.sigmoid(b_y)
    p_y = y + (bos + t0) * D + o_c[:, None] * D + o_d[None, :]
    tl.store(p_y, b_y.to(y.dtype.element_ty), mask=m_c[:, None] & m_d[None, :])

    o_j = tl.arange(0, BW)
    if HAS_SNAP:
        # cuts p in (t0, t_end] get W - 1 rows, the others none (the flag enters the mask as a row count)
        t_end = tl.minimum(t0 + BT, length)
        for i_cut in range(C):
            p_cut = tl.load(snap_pos + i_n * C + i_cut)
            rows = (W - 1) * ((p_cut > t0) & (p_cut <= t_end)).to(tl.int32)
            b_f, m_j = _last_inputs(x + bos * stride_x_t, p_s, p_cut, first, rows, stride_x_t, o_d, m_d, D, W, BW)
            p_snap = conv_states + tl.load(snap_slots + i_n * C + i_cut).to(tl.int64) * stride_s
            tl.store(p_snap + o_j[:, None] * D + o_d[None, :], b_f.to(conv_states.dtype.element_ty), mask=m_j)

    if i_t == 0:
        tl.debug_barrier()  # every thread's reads of the initial state come before the writes below
        b_f, m_j = _last_inputs(p_x, p_s, length, first, W - 1, stride_x_t, o_d, m_d, D, W, BW)
        tl.debug_barrier()
        tl.store(p_s + o_j[:, None] * D + o_d[None, :], b_f.to(conv_states.dtype.element_ty), mask=m_j)


@cached_launch
@triton.jit
def _causal_conv1d_update_kernel(
    x,
    weight,
    bias,
    conv_states,
    state_slots,
    y,
    stride_x_b,
    stride_s,
    pad_slot,
    D: tl.constexpr,
    W: tl.constexpr,
    BD: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    USE_SILU: tl.constexpr,
):
    """One program per (channel block, request): reads the W - 1 state rows and the new input
    once, writes the output and the shifted state rows."""
    i_d, i_b = tl.program_id(0), tl.program_id(1).to(tl.int64)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    p_y = y + i_b * D + o_d
    # the input and the weights first: their loads overlap the slot's, on which the state loads wait
    b_x = tl.load(x + i_b * stride_x_b + o_d, mask=m_d, other=0.0)
    b_xw = b_x.to(tl.float32) * tl.load(weight + o_d * W + (W - 1), mask=m_d, other=0.0).to(tl.float32)
    b_y = tl.zeros([BD], dtype=tl.float32)
    if HAS_BIAS:
        b_y += tl.load(bias + o_d, mask=m_d, other=0.0).to(tl.float32)
    slot = tl.load(state_slots + i_b).to(tl.int64)
    if slot == pad_slot:
        tl.store(p_y, tl.zeros([BD], dtype=tl.float32).to(y.dtype.element_ty), mask=m_d)
        return
    p_s = conv_states + slot * stride_s + o_d
    for j in tl.static_range(W - 1):
        b_s = tl.load(p_s + j * D, mask=m_d, other=0.0)
        b_y += b_s.to(tl.float32) * tl.load(weight + o_d * W + j, mask=m_d, other=0.0).to(tl.float32)
        if j > 0:
            tl.store(p_s + (j - 1) * D, b_s, mask=m_d)
    b_y += b_xw
    tl.store(p_s + (W - 2) * D, b_x.to(conv_states.dtype.element_ty), mask=m_d)
    if USE_SILU:
        b_y = b_y * tl.sigmoid(b_y)
    tl.store(p_y, b_y.to(y.dtype.element_ty), mask=m_d)


@cached_launch
@triton.jit(do_not_specialize=["C"])
def _causal_conv1d_rows_kernel(
    x,
    weight,
    bias,
    conv_states,
    cu_seqlens,
    state_slots,
    has_initial_state,
    snap_pos,
    snap_slots,
    y,
    stride_x_t,
    stride_s,
    pad_slot,
    C,
    D: tl.constexpr,
    W: tl.constexpr,
    BD: tl.constexpr,
    BW: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    USE_SILU: tl.constexpr,
    HAS_SNAP: tl.constexpr,
):
    """One program per (channel block, row) for rows of a few tokens: the row's tokens one after another
    (taps before the row start read the slot's state), then the snapshot of each cut and the final state.
    Rows in pad_slot are skipped (zero outputs). The prefill kernel's contract, without its 64-token tiles."""
    i_d, i_n = tl.program_id(0), tl.program_id(1).to(tl.int64)
    o_d = i_d * BD + tl.arange(0, BD)
    m_d = o_d < D
    zero = o_d * 0  # scalar bounds enter masks through a vector (the interpreter cannot broadcast a bool)
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    length = tl.load(cu_seqlens + i_n + 1).to(tl.int64) - bos
    slot = tl.load(state_slots + i_n).to(tl.int64)
    p_y = y + bos * D + o_d
    if slot == pad_slot:
        for t in range(length):
            tl.store(p_y + t * D, tl.zeros([BD], dtype=tl.float32).to(y.dtype.element_ty), mask=m_d)
        return
    first = (1 - W) * (tl.load(has_initial_state + i_n) != 0).to(tl.int32)
    p_x = x + bos * stride_x_t
    p_s = conv_states + slot * stride_s
    for t in range(length):
        b_y = tl.zeros([BD], dtype=tl.float32)
        if HAS_BIAS:
            b_y += tl.load(bias + o_d, mask=m_d, other=0.0).to(tl.float32)
        for j in tl.static_range(W):
            pos = zero + t + (j - (W - 1))  # the tap's position in the row; below 0: row pos + W - 1 of the state
            b_in = tl.load(p_x + pos * stride_x_t + o_d, mask=m_d & (pos >= 0), other=0.0).to(tl.float32)
            b_in += tl.load(p_s + (pos + W - 1) * D + o_d, mask=m_d & (pos < 0) & (pos >= first),
                            other=0.0).to(tl.float32)
            b_y += b_in * tl.load(weight + o_d * W + j, mask=m_d, other=0.0).to(tl.float32)
        if USE_SILU:
            b_y = b_y * tl.sigmoid(b_y)
        tl.store(p_y + t * D, b_y.to(y.dtype.element_ty), mask=m_d)
    o_j = tl.arange(0, BW)
    if HAS_SNAP:
        for i_cut in range(C):
            p_cut = tl.load(snap_pos + i_n * C + i_cut)
            rows = (W - 1) * (p_cut > 0).to(tl.int32)  # -1: no cut, no rows
            b_f, m_j = _last_inputs(p_x, p_s, p_cut, first, rows, stride_x_t, o_d, m_d, D, W, BW)
            p_snap = conv_states + tl.load(snap_slots + i_n * C + i_cut).to(tl.int64) * stride_s
            tl.store(p_snap + o_j[:, None] * D + o_d[None, :], b_f.to(conv_states.dtype.element_ty), mask=m_j)
    tl.debug_barrier()  # every thread's reads of the initial state come before the writes below
    b_f, m_j = _last_inputs(p_x, p_s, length, first, W - 1, stride_x_t, o_d, m_d, D, W, BW)
    tl.debug_barrier()
    tl.store(p_s + o_j[:, None] * D + o_d[None, :], b_f.to(conv_states.dtype.element_ty), mask=m_j)


def _check_conv_args(x, weight, bias, conv_states, activation):
    D, W = weight.shape
    assert x.ndim == 2 and x.shape[1] == D and x.stride(1) == 1, f"x {tuple(x.shape)} strides {x.stride()}"
    assert W >= 2 and weight.is_contiguous(), f"weight {tuple(weight.shape)} must be a contiguous [D, W>=2]"
    assert bias is None or bias.shape == (D,)
    assert conv_states.shape[1:] == (W - 1, D), f"conv_states {tuple(conv_states.shape)} != [S, {W - 1}, {D}]"
    assert conv_states.stride()[1:] == (D, 1), "conv_states must be contiguous within a slot"
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"unsupported conv1d activation {activation!r}; expected 'silu' or None")
    return D, W


def _prefill_config() -> tuple[int, int, int]:
    """(BT, BD, num_warps): [64, 64] tiles on 4 warps, the best of the H200 sweeps (8192 channels)."""
    return 64, 64, 4


def _update_config(batch: int) -> tuple[int, int]:
    """(BD, num_warps) from the H200 sweeps (8192 channels): narrower programs for small batches."""
    return (512, 2) if batch < 4 else (256, 2) if batch < 32 else (1024, 8)


def _check_snapshot_args(snap_pos, snap_slots, num_seqs: int) -> bool:
    """Whether a call takes snapshots; asserts the shapes of snap_pos and snap_slots [N, C]."""
    if snap_pos is None and snap_slots is None:
        return False
    assert snap_pos is not None and snap_slots is not None, "snap_pos and snap_slots are given together"
    assert snap_pos.ndim == 2 and snap_pos.shape[0] == num_seqs and snap_pos.shape[1] >= 1, (
        f"snap_pos {tuple(snap_pos.shape)} != [{num_seqs}, C >= 1]")
    assert snap_slots.shape == snap_pos.shape, f"snap_slots {tuple(snap_slots.shape)} != {tuple(snap_pos.shape)}"
    for name, t in (("snap_pos", snap_pos), ("snap_slots", snap_slots)):
        assert t.dtype == torch.int32 and t.is_contiguous(), f"{name} must be a contiguous int32 tensor"
    return True


def _conv_prefill_fwd(x, weight, bias, conv_states, cu_seqlens, state_slots, has_initial_state, activation,
                      snap_pos=None, snap_slots=None, BT=None, BD=None, num_warps=None):
    D, W = _check_conv_args(x, weight, bias, conv_states, activation)
    if BT is None:
        BT, BD, num_warps = _prefill_config()
    T, N = x.shape[0], state_slots.shape[0]
    assert cu_seqlens.shape == (N + 1,) and has_initial_state.shape == (N,)
    assert W - 1 <= BT
    has_snap = _check_snapshot_args(snap_pos, snap_slots, N)
    y = torch.empty(T, D, dtype=x.dtype, device=x.device)
    if N == 0:
        return y
    grid = (cdiv(D, BD), num_virtual_chunks(T, N, BT))
    _causal_conv1d_prefill_kernel[grid](
        x, weight, bias, conv_states, cu_seqlens, state_slots, has_initial_state,
        snap_pos if has_snap else state_slots, snap_slots if has_snap else state_slots, y,
        x.stride(0), conv_states.stride(0), N, snap_pos.shape[1] if has_snap else 1,
        D=D, W=W, BT=BT, BD=BD, BW=next_power_of_2(W - 1), BLOCK_N=64,
        HAS_BIAS=bias is not None, USE_SILU=activation is not None, HAS_SNAP=has_snap, num_warps=num_warps,
    )
    return y


def causal_conv1d_rows(
    *,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    pad_slot: int = -1,
    activation: str | None = "silu",
    snap_pos: torch.Tensor | None = None,
    snap_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """causal_conv1d_prefill for rows of a few tokens (speculative verify steps): one program per channel
    block and row, token by token, instead of 64-token tiles; rows in pad_slot are skipped (zero outputs)."""
    D, W = _check_conv_args(x, weight, bias, conv_states, activation)
    T, N = x.shape[0], state_slots.shape[0]
    assert cu_seqlens.shape == (N + 1,) and has_initial_state.shape == (N,)
    has_snap = _check_snapshot_args(snap_pos, snap_slots, N)
    y = torch.empty(T, D, dtype=x.dtype, device=x.device)
    if N == 0:
        return y
    BD, num_warps = _update_config(N)
    BD = min(BD, next_power_of_2(D))
    _causal_conv1d_rows_kernel[(cdiv(D, BD), N)](
        x, weight, bias, conv_states, cu_seqlens, state_slots, has_initial_state,
        snap_pos if has_snap else state_slots, snap_slots if has_snap else state_slots, y,
        x.stride(0), conv_states.stride(0), pad_slot, snap_pos.shape[1] if has_snap else 1,
        D=D, W=W, BD=BD, BW=next_power_of_2(W - 1), HAS_BIAS=bias is not None,
        USE_SILU=activation is not None, HAS_SNAP=has_snap, num_warps=num_warps,
    )
    return y


def _conv_update_fwd(x, weight, bias, conv_states, state_slots, pad_slot, activation, BD=None, num_warps=None):
    D, W = _check_conv_args(x, weight, bias, conv_states, activation)
    B = x.shape[0]
    assert state_slots.shape == (B,)
    y = torch.empty(B, D, dtype=x.dtype, device=x.device)
    if B == 0:
        return y
    if BD is None:
        BD, num_warps = _update_config(B)
    BD = min(BD, next_power_of_2(D))
    grid = (cdiv(D, BD), B)
    _causal_conv1d_update_kernel[grid](
        x, weight, bias, conv_states, state_slots, y, x.stride(0), conv_states.stride(0), pad_slot,
        D=D, W=W, BD=BD, HAS_BIAS=bias is not None, USE_SILU=activation is not None, num_warps=num_warps,
    )
    return y


def causal_conv1d_prefill(
    *,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
    snap_pos: torch.Tensor | None = None,
    snap_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton version of causal_conv1d_prefill_ref (same arguments and result); x may have a row
    stride larger than D. Final conv states are written into the slots. Snapshots cost no host
    work: the program of the chunk holding a cut copies its W - 1 rows, and every program reads its
    sequence's C cut positions; without snap_pos the kernel is compiled without them."""
    return _conv_prefill_fwd(x, weight, bias, conv_states, cu_seqlens, state_slots, has_initial_state,
                             activation, snap_pos, snap_slots)


def causal_conv1d_update(
    *,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    state_slots: torch.Tensor,
    pad_slot: int = -1,
    activation: str | None = "silu",
) -> torch.Tensor:
    """Triton version of causal_conv1d_update_ref (same arguments and result); x may have a row
    stride larger than D. Conv states are updated in place."""
    return _conv_update_fwd(x, weight, bias, conv_states, state_slots, pad_slot, activation)


def _activate(x: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return x
    if activation in ("silu", "swish"):
        return F.silu(x)
    raise ValueError(f"unsupported conv1d activation {activation!r}; expected 'silu' or None")


def causal_conv1d_prefill_ref(
    *,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    activation: str | None = "silu",
    snap_pos: torch.Tensor | None = None,
    snap_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """x: [T, D] packed; weight: [D, W]; conv_states: [S, W-1, D]; cu_seqlens: [B+1];
    state_slots, has_initial_state: [B]. snap_pos, snap_slots: [B, C] int32 or None;
    snap_pos[n, c] = p (1 <= p <= length of sequence n in this call; ascending, then -1) asks for
    the conv state after the sequence's first p tokens of this call in conv_states[snap_slots[n, c]];
    slots of -1 cuts are ignored. Snapshot slots must differ from each other and from state_slots.
    Returns y: [T, D] in x's dtype."""
    width = weight.shape[1]
    w = weight.float().t()  # [W, D]
    y = torch.empty_like(x)
    bounds = cu_seqlens.tolist()
    cuts = snapshot_cuts(snap_pos, snap_slots, bounds)
    for i, slot in enumerate(state_slots.tolist()):
        start, end = bounds[i], bounds[i + 1]
        if bool(has_initial_state[i]):
            init = conv_states[slot].float()
        else:
            init = x.new_zeros(width - 1, x.shape[1], dtype=torch.float32)
        full = torch.cat([init, x[start:end].float()])  # [W-1+L, D]
        windows = full.unfold(0, width, 1)  # [L, D, W]
        out = torch.einsum("ldw,wd->ld", windows, w)
        if bias is not None:
            out = out + bias.float()
        y[start:end] = _activate(out, activation).to(x.dtype)
        for p, snap_slot in cuts[i].items():
            conv_states[snap_slot] = full[p : p + width - 1].to(conv_states.dtype)  # the W-1 inputs before p
        conv_states[slot] = full[full.shape[0] - (width - 1) :].to(conv_states.dtype)
    return y


def causal_conv1d_rows_ref(*, x, weight, bias, conv_states, cu_seqlens, state_slots, has_initial_state,
                           pad_slot: int = -1, activation: str | None = "silu", snap_pos=None,
                           snap_slots=None) -> torch.Tensor:
    """causal_conv1d_rows in torch (the same arguments and result): every row at once, its tokens padded to the
    longest row's, for rows of a few tokens (verify steps), where causal_conv1d_prefill_ref loops over rows.
    Rows in pad_slot are skipped: zero outputs, no state written."""
    width = weight.shape[1]
    y = torch.zeros_like(x)
    bounds, slots = cu_seqlens.tolist(), state_slots.tolist()
    live = [i for i, slot in enumerate(slots) if slot != pad_slot and bounds[i + 1] > bounds[i]]
    if not live:
        return y
    dev = x.device
    live_t = torch.tensor(live, device=dev)
    lens = torch.tensor([bounds[i + 1] - bounds[i] for i in live], device=dev)
    j = torch.arange(int(lens.max()), device=dev)
    tokens = (torch.tensor([bounds[i] for i in live], device=dev)[:, None] + j).clamp(max=x.shape[0] - 1)
    real = j < lens[:, None]  # [b, M]
    live_slots = state_slots.long()[live_t]
    init = torch.where(has_initial_state[live_t].bool()[:, None, None], conv_states[live_slots].float(), 0.0)
    full = torch.cat([init, x[tokens].float() * real[..., None]], dim=1)  # [b, W-1+M, D]
    out = torch.einsum("bldw,wd->bld", full.unfold(1, width, 1), weight.float().t())
    if bias is not None:
        out = out + bias.float()
    y[tokens[real]] = _activate(out, activation)[real].to(x.dtype)
    cuts = snapshot_cuts(snap_pos, snap_slots, bounds)
    for b, i in enumerate(live):
        for p, snap_slot in cuts[i].items():
            conv_states[snap_slot] = full[b, p : p + width - 1].to(conv_states.dtype)  # the W-1 inputs before p
    last = lens[:, None] + torch.arange(width - 1, device=dev)  # the W-1 inputs before each row's end
    conv_states[live_slots] = full[torch.arange(len(live), device=dev)[:, None], last].to(conv_states.dtype)
    return y


def causal_conv1d_update_ref(
    *,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    state_slots: torch.Tensor,
    pad_slot: int = -1,
    activation: str | None = "silu",
) -> torch.Tensor:
    """One decode token per request. x: [B, D]; conv_states: [S, W-1, D] updated in place at
    state_slots [B]; rows whose slot is `pad_slot` are skipped (output zero)."""
    y = torch.zeros_like(x)
    keep = (state_slots != pad_slot).nonzero().flatten()
    if keep.numel() == 0:
        return y
    slots = state_slots[keep].long()
    full = torch.cat([conv_states[slots].float(), x[keep].float().unsqueeze(1)], dim=1)  # [b, W, D]
    out = torch.einsum("bwd,dw->bd", full, weight.float())
    if bias is not None:
        out = out + bias.float()
    y[keep] = _activate(out, activation).to(x.dtype)
    conv_states[slots] = full[:, 1:].to(conv_states.dtype)
    return y
