"""Gated delta rule token by token over short packed rows (speculative verify steps, tiny extends).

The chunked kernels (gdn_chunk.py) give every row at least one 64-token chunk of work: a verify row
of 4 tokens costs what 64 prompt tokens cost, so a verify step at batch 32 costs a 2,048-token
prefill there. Here one program holds a [K, BV] state tile of one (row, value head) in registers
and steps through the row's tokens with the decode kernel's update (gdn_recurrent.py): the tile is
read once, written once at the end, and once more at each snapshot cut (the states a verify step
rolls back to). Same arguments and result as gdn_chunk.gdn_prefill, plus pad_slot: rows in the pad
slot are skipped (their outputs are zero), so the pad rows of a padded graph shape cost nothing.
"""


import torch
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.gdn_chunk import check_varlen_args
from triton_kernels.gdn_gating import gdn_gate, gdn_gating_ref, l2norm, l2norm_ref
from triton_kernels.gdn_recurrent import _decode_config
from triton_kernels.host_math import cdiv, next_power_of_2
from triton_kernels.varlen import snapshot_cuts


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


def gdn_rows_ref(*, q, k, v, a, b, A_log, dt_bias, ssm_states, cu_seqlens, state_slots, has_initial_state,
                 pad_slot: int = -1, scale=None, snap_pos=None, snap_slots=None, write_final: bool = True,
                 row_lens=None) -> torch.Tensor:
    """gdn_rows defined in torch, token by token as the kernel steps: step j applies the decode update
    (gdn_recurrent.gdn_decode_ref's) to every row that has a j-th token, all such rows at once, so a verify
    step of N rows of k + 1 tokens costs k + 1 batched updates (gdn_chunk.gdn_prefill_ref would solve a
    64-token chunk per row and cut). Same arguments and result as gdn_rows: pad-slot rows and tokens past
    row_lens are not run (zero outputs), nothing is written with write_final=False but the snapshots."""
    T, HK, K, HV, V, N, _ = check_varlen_args(q, k, v, a, b, A_log, dt_bias, ssm_states, cu_seqlens,
                                              state_slots, has_initial_state, snap_pos, snap_slots)
    scale = K ** -0.5 if scale is None else scale
    o = torch.zeros(T, HV, V, dtype=v.dtype, device=v.device)
    cu, slots = cu_seqlens.tolist(), state_slots.tolist()
    lens = [cu[i + 1] - cu[i] for i in range(N)]
    if row_lens is not None:
        lens = [min(n, m) for n, m in zip(lens, row_lens.tolist())]
    live = [i for i in range(N) if slots[i] != pad_slot and lens[i] > 0]
    if not live:
        return o
    row_cuts = snapshot_cuts(snap_pos, snap_slots, cu)
    cuts = {(n, p): snap_slot for n, i in enumerate(live) for p, snap_slot in row_cuts[i].items() if p <= lens[i]}
    dev, n_rep = v.device, HV // HK
    g, beta = gdn_gating_ref(a, b, A_log, dt_bias)  # [T, HV]
    qf = l2norm_ref(q).repeat_interleave(n_rep, dim=1) * scale  # [T, HV, K]
    kf = l2norm_ref(k).repeat_interleave(n_rep, dim=1)
    vf = v.float()
    live_t = torch.tensor(live, dtype=torch.long, device=dev)
    live_slots = state_slots.long()[live_t]
    init = has_initial_state[live_t].bool()[:, None, None, None]
    state = torch.where(init, ssm_states[live_slots].float(), 0.0)  # [n, HV, K, V]
    for j in range(max(lens[i] for i in live)):
        rows = [n for n, i in enumerate(live) if lens[i] > j]
        tok = torch.tensor([cu[live[n]] + j for n in rows], dtype=torch.long, device=dev)
        at = torch.tensor(rows, dtype=torch.long, device=dev)
        s = state[at] * g[tok].exp()[..., None, None]
        u = beta[tok][..., None] * (vf[tok] - torch.einsum("bhk,bhkv->bhv", kf[tok], s))
        s = s + kf[tok][..., :, None] * u[..., None, :]
        o[tok] = torch.einsum("bhk,bhkv->bhv", qf[tok], s).to(v.dtype)
        state[at] = s
        for r, n in enumerate(rows):
            if (n, j + 1) in cuts:
                ssm_states[cuts[n, j + 1]] = s[r].to(ssm_states.dtype)
    if write_final:
        ssm_states[live_slots] = state.to(ssm_states.dtype)
    return o
