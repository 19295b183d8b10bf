"""Gated delta rule token by token over short packed rows (speculative verify steps, tiny extends).

The chunked kernels (gdn_chunk.py) give every row at least one 64-token chunk of work: a verify row
of 4 tokens costs what 64 prompt tokens cost, so a verify step at batch 32 costs a 2,048-token
prefill there. Here one program holds a [K, BV] state tile of one (row, value head) in registers
and steps through the row's tokens with the decode kernel's update (gdn_recurrent.py): the tile is
read once, written once at the end, and once more at each snapshot cut (the states a verify step
rolls back to). Same arguments and result as gdn_chunk.gdn_prefill, plus pad_slot: rows in the pad
slot are skipped (their outputs are zero), so the pad rows of a padded graph shape cost nothing.
"""

import itertools

import torch
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.gdn_chunk import check_varlen_args, gdn_prefill_ref
from triton_kernels.gdn_gating import gdn_gate, l2norm
from triton_kernels.gdn_recurrent import _decode_config
from triton_kernels.host_math import cdiv, next_power_of_2


@cached_launch
@triton.jit(do_not_specialize=["C"])
def _gdn_rows_kernel(
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    ssm_states,
    cu_seqlens,
    state_slots,
    has_initial_state,
    snap_pos,
    snap_slots,
    row_lens,
    o,
    stride_q_t,
    stride_q_h,
    stride_k_t,
    stride_k_h,
    stride_v_t,
    stride_v_h,
    stride_a_t,
    stride_b_t,
    stride_s,
    pad_slot,
    scale,
    C,
    HK: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    HAS_SNAP: tl.constexpr,
    WRITE_FINAL: tl.constexpr,
    HAS_LENS: tl.constexpr,
):
    """One program per (V block, value head, row): the row's tokens one after another, the state tile in
    registers; after token t (t + 1 tokens in) the tile goes to snap_slots[row, c] when snap_pos[row, c]
    == t + 1 (cuts ascend, -1 after the last), and after the last token back to the row's slot (unless
    not WRITE_FINAL: the slot keeps the state before the row)."""
    i_v, i_h, i_n = tl.program_id(0), tl.program_id(1), tl.program_id(2).to(tl.int64)
    i_hk = i_h // (HV // HK)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < K
    m_v = o_v < V
    m_s = m_k[:, None] & m_v[None, :]
    bos = tl.load(cu_seqlens + i_n).to(tl.int64)
    eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
    if HAS_LENS:  # only the row's first row_lens[row] tokens
        eos = tl.minimum(eos, bos + tl.load(row_lens + i_n).to(tl.int64))
    slot = tl.load(state_slots + i_n).to(tl.int64)
    if slot == pad_slot:
        for t in range(bos, eos):
            tl.store(o + (t * HV + i_h) * V + o_v, tl.zeros([BV], dtype=tl.float32).to(o.dtype.element_ty), mask=m_v)
        return
    tile = i_h * K * V + o_k[:, None] * V + o_v[None, :]
    # no initial state: the load reads nothing (a mask bound, as the interpreter cannot broadcast a bool)
    k_init = K * (tl.load(has_initial_state + i_n) != 0).to(tl.int32)
    b_s = tl.load(ssm_states + slot * stride_s + tile, mask=m_s & (o_k < k_init)[:, None], other=0.0).to(tl.float32)
    A = tl.load(A_log + i_h).to(tl.float32)
    dt = tl.load(dt_bias + i_h).to(tl.float32)
    cut = 0
    next_cut = -1
    if HAS_SNAP:
        next_cut = tl.load(snap_pos + i_n * C)
    for t in range(bos, eos):
        b_q = tl.load(q + t * stride_q_t + i_hk * stride_q_h + o_k, mask=m_k, other=0.0)
        b_k = tl.load(k + t * stride_k_t + i_hk * stride_k_h + o_k, mask=m_k, other=0.0)
        b_v = tl.load(v + t * stride_v_t + i_h * stride_v_h + o_v, mask=m_v, other=0.0).to(tl.float32)
        b_g, b_beta = gdn_gate(tl.load(a + t * stride_a_t + i_h), tl.load(b + t * stride_b_t + i_h), A, dt)
        b_q = l2norm(b_q, 0) * scale
        b_k = l2norm(b_k, 0)
        b_s = b_s * tl.exp(b_g)
        b_u = b_beta * (b_v - tl.sum(b_s * b_k[:, None], 0))  # [BV]
        b_s = b_s + b_k[:, None] * b_u[None, :]
        b_o = tl.sum(b_s * b_q[:, None], 0)
        tl.store(o + (t * HV + i_h) * V + o_v, b_o.to(o.dtype.element_ty), mask=m_v)
        if HAS_SNAP:  # noqa: SIM102 (a compile-time branch around a run-time one)
            if t - bos + 1 == next_cut:
                p_snap = ssm_states + tl.load(snap_slots + i_n * C + cut).to(tl.int64) * stride_s + tile
                tl.store(p_snap, b_s.to(ssm_states.dtype.element_ty), mask=m_s)
                cut += 1
                next_cut = tl.load(snap_pos + i_n * C + cut, mask=cut < C, other=-1)
    if WRITE_FINAL:
        tl.store(ssm_states + slot * stride_s + tile, b_s.to(ssm_states.dtype.element_ty), mask=m_s)


def gdn_rows(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    ssm_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    pad_slot: int = -1,
    scale: float | None = None,
    snap_pos: torch.Tensor | None = None,
    snap_slots: torch.Tensor | None = None,
    write_final: bool = True,
    row_lens: torch.Tensor | None = None,
) -> torch.Tensor:
    """gdn_chunk.gdn_prefill computed token by token (the same arguments, shapes and result; q, k, v, a, b
    may be strided views), for rows of a few tokens; rows in pad_slot are skipped (zero outputs).
    write_final=False leaves every row's slot as it was (the outputs and snapshots are the same): a
    verify step that keeps its slots as checkpoints and replays the accepted tokens afterwards.
    row_lens [N] (int, on the device): run only the first row_lens[i] tokens of row i (at most its length;
    0: none), the state going to the slot after them; the outputs of the tokens not run are not written.
    That replay reads the kept tokens where the verify step's inputs lie, with no gather."""
    T, HK, K, HV, V, N, has_snap = check_varlen_args(q, k, v, a, b, A_log, dt_bias, ssm_states, cu_seqlens,
                                                     state_slots, has_initial_state, snap_pos, snap_slots)
    assert row_lens is None or row_lens.shape == (N,), f"row_lens {tuple(row_lens.shape)} for {N} rows"
    scale = K ** -0.5 if scale is None else scale
    o = torch.empty(T, HV, V, dtype=v.dtype, device=v.device)
    if N == 0:
        return o
    BV, num_warps = _decode_config(N, HV, K, V)
    _gdn_rows_kernel[(cdiv(V, BV), HV, N)](
        q, k, v, a, b, A_log, dt_bias, ssm_states, cu_seqlens, state_slots, has_initial_state,
        snap_pos if has_snap else state_slots, snap_slots if has_snap else state_slots,
        row_lens if row_lens is not None else state_slots, o,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), a.stride(0), b.stride(0),
        ssm_states.stride(0), pad_slot, scale, snap_pos.shape[1] if has_snap else 1,
        HK=HK, HV=HV, K=K, V=V, BK=next_power_of_2(K), BV=BV, HAS_SNAP=has_snap, WRITE_FINAL=write_final,
        HAS_LENS=row_lens is not None, num_warps=num_warps,
    )
    return o


def gdn_rows_ref(*, pad_slot: int = -1, write_final: bool = True, row_lens: torch.Tensor | None = None,
                 **kwargs) -> torch.Tensor:
    """gdn_rows defined in torch: gdn_chunk.gdn_prefill_ref over the rows (pad rows are computed too; their
    outputs go unread), the slots put back after it when not write_final, and with row_lens only each row's
    first row_lens[i] tokens run (gathered into rows of their own; the other outputs are zeros)."""
    if row_lens is not None:
        cu, lens = kwargs["cu_seqlens"], row_lens.tolist()
        starts = cu.tolist()
        picked = torch.tensor([t for start, m in zip(starts, lens) for t in range(start, start + m)],
                              dtype=torch.long, device=cu.device)
        rows = {name: kwargs[name].index_select(0, picked) for name in ("q", "k", "v", "a", "b")}
        cu_kept = torch.tensor([0, *itertools.accumulate(lens)], dtype=cu.dtype, device=cu.device)
        o_kept = gdn_rows_ref(write_final=write_final, **{**kwargs, **rows, "cu_seqlens": cu_kept})
        o = torch.zeros(kwargs["v"].shape, dtype=o_kept.dtype, device=o_kept.device)
        return o.index_copy_(0, picked, o_kept)
    if write_final:
        return gdn_prefill_ref(**kwargs)
    states, slots = kwargs["ssm_states"], kwargs["state_slots"].long()
    before = states[slots].clone()
    o = gdn_prefill_ref(**kwargs)
    states[slots] = before
    return o
