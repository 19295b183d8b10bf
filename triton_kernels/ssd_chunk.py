"""Mamba2 prefill (SSD) over packed varlen sequences, states read from and written to pool slots.

The recurrence is the one of `ssm_step.mamba2_decode_ref`, run over every token of each
sequence; sequence i owns tokens cu_seqlens[i]:cu_seqlens[i+1] and slot state_slots[i], and
starts from that slot's state when has_initial_state[i] (else from zeros). The final state of
each sequence is written back to its slot. Optional snapshots (snap_pos, snap_slots) also write
the state after the first p tokens of a sequence to another slot, for the prefix cache.

`mamba2_prefill` computes it by chunks of L tokens that never straddle sequences. Per head, with
a = dt * A (A = -exp(A_log)), c = cumsum(a) within the chunk, S0 [P, N] the state entering it:
    y_t = exp(c_t) C_t S0^T + sum_{s <= t} (C_t . B_s) exp(c_t - c_s) dt_s x_s + D x_t
    S1  = exp(c_L) S0 + sum_s exp(c_L - c_s) dt_s x_s (outer) B_s
the first line the output of every token, the second the state handed to the next chunk; both
are matmuls over the chunk. The state after p tokens inside a chunk is the second line with the
chunk ending at p. Kernels and scratch: ssd_chunk_parts.py.
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.nn.functional as F

from triton_kernels.host_math import cdiv, next_power_of_2
from triton_kernels.ssd_chunk_parts import _ssd_chunk_output_kernel, _ssd_chunk_state_kernel, _ssd_dt_kernel
from triton_kernels.varlen import num_virtual_chunks, snapshot_cuts

# With snapshot cuts the state kernel updates a chunk in windows of at most this many tokens, so that a cut at a
# multiple of the window costs a store: at 128-token tiles a cut inside a chunk takes a second 128-token MMA
# (Nemotron-H-8B's 8 x 1k prefill: the state kernel 9.2 -> 16.6 ms with the prefix cache's default cuts, one H100),
# while its fixed cuts from 128 on are multiples of 64. 64-token windows (HYBRID_SGL_SSD_SNAPSHOT_WINDOW=64) are
# checked on the CPU only (interpreter parity, the sm_90a build): off by default until they are timed on a GPU.
SNAPSHOT_WINDOW = int(os.environ.get("HYBRID_SGL_SSD_SNAPSHOT_WINDOW", "128"))
if SNAPSHOT_WINDOW < 16 or SNAPSHOT_WINDOW & (SNAPSHOT_WINDOW - 1):
    raise ValueError(f"HYBRID_SGL_SSD_SNAPSHOT_WINDOW={SNAPSHOT_WINDOW}: a power of two from 16 on")


def tile_tokens(chunk_size: int, N: int) -> int:
    """Tokens per kernel chunk: the config's chunk_size rounded up to a power of two >= 16 (the
    result does not depend on the tiling beyond rounding), at most 128 (the output kernel keeps a
    [tile, tile] fp32 C B^T in registers), at most 64 for d_state above 128 (its [tile, N] C and the
    [N, 64] state blocks would spill at 128)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size} must be positive")
    tile = max(16, 1 << (chunk_size - 1).bit_length())
    return min(tile, 128 if N <= 128 else 64)


@dataclasses.dataclass(frozen=True)
class SSDLaunch:
    """Launch parameters of the state and output kernels (the dt kernel is tiny)."""

    state_block_p: int  # head-dim rows of the state per sequential program
    state_warps: int
    state_stages: int
    heads_per_program: int  # heads of one group sharing one C B^T in the output kernel
    output_warps: int
    output_stages: int


def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def default_launch(num_tokens: int, num_seqs: int, H: int, G: int, P: int, N: int, tile: int,
                   device: torch.device) -> SSDLaunch:
    """Chosen by hand for sm90, not autotuned (the state kernel updates the pool in place, so an
    autotuner's repeated runs would corrupt it). State kernel: state slices of up to 8192 fp32
    ([64, 128] at N = 128: 64 registers a thread on 4 warps), halved when the (sequence, head,
    P block) programs do not fill the GPU twice (each re-reads B, which the heads of a group share
    through L2); two stages of prefetch leave room for two programs per SM. Output kernel: 8 warps
    for 128-token tiles (the [128, 128] fp32 C B^T takes 64 registers a thread) and for N above 128,
    and as many heads of a group per program (C B^T computed once for all of them) as leave four
    programs per SM."""
    sms = _num_sms(device)
    block_n = max(16, next_power_of_2(N))
    block_p = min(max(16, next_power_of_2(P)), max(16, 8192 // block_n))
    if num_seqs * H * cdiv(P, block_p) < 2 * sms and block_p > 16:
        block_p //= 2
    heads, per_group = 1, H // G
    chunk_groups = num_virtual_chunks(num_tokens, num_seqs, tile) * G
    while per_group % (2 * heads) == 0 and chunk_groups * (per_group // (2 * heads)) >= 4 * sms:
        heads *= 2
    return SSDLaunch(state_block_p=block_p, state_warps=4, state_stages=2, heads_per_program=heads,
                     output_warps=8 if tile >= 128 or N > 128 else 4, output_stages=2)


def state_warps_stages(launch: SSDLaunch, dtype: torch.dtype, has_snap: bool) -> tuple[int, int]:
    """(num_warps, num_stages) of the state kernel: 8 warps for float32 inputs with snapshots (at
    128-token tiles the split updates' tf32x3 operands spill on 4), else the launch's."""
    return (8 if has_snap and dtype == torch.float32 else launch.state_warps), launch.state_stages


def check_snapshots(snap_pos: torch.Tensor | None, snap_slots: torch.Tensor | None, num_seqs: int) -> int:
    """Asserts the snapshot arguments' shapes (not their values: that would sync) and returns the
    cuts per sequence (0 without snapshots)."""
    assert (snap_pos is None) == (snap_slots is None), "snap_pos and snap_slots come together"
    if snap_pos is None:
        return 0
    assert snap_pos.dim() == 2 and snap_pos.shape[0] == num_seqs and snap_pos.shape[1] >= 1, (
        f"snap_pos {tuple(snap_pos.shape)} != [{num_seqs}, cuts >= 1]")
    assert snap_slots.shape == snap_pos.shape, (snap_slots.shape, snap_pos.shape)
    for name, t in (("snap_pos", snap_pos), ("snap_slots", snap_slots)):
        assert t.dtype == torch.int32 and t.is_contiguous(), f"{name} must be contiguous int32; got {t.dtype}"
    return snap_pos.shape[1]


def _mamba2_prefill_fwd(x, dt, A_log, B, C, D, dt_bias, z, ssm_states, cu_seqlens, state_slots, has_initial_state,
                        chunk_size, dt_limit, snap_pos=None, snap_slots=None, launch: SSDLaunch | None = None):
    T, H, P = x.shape
    G, N = B.shape[1:]
    S = state_slots.shape[0]
    assert H % G == 0, f"{H} heads are not a multiple of {G} groups"
    assert dt.shape == (T, H) and B.shape == (T, G, N) and C.shape == (T, G, N), (dt.shape, B.shape, C.shape)
    assert A_log.shape == D.shape == dt_bias.shape == (H,), (A_log.shape, D.shape, dt_bias.shape)
    assert z is None or z.shape == x.shape, (z.shape, x.shape)
    assert B.dtype == C.dtype == x.dtype, (x.dtype, B.dtype, C.dtype)
    assert ssm_states.shape[1:] == (H, P, N), f"ssm_states {tuple(ssm_states.shape)} != [S, {H}, {P}, {N}]"
    assert ssm_states.stride()[1:] == (P * N, N, 1), "ssm_states must be contiguous within a slot"
    assert cu_seqlens.shape == (S + 1,) and has_initial_state.shape == (S,)
    for name, t in (("x", x), ("dt", dt), ("B", B), ("C", C), ("z", z)):
        assert t is None or t.stride(-1) == 1, f"{name} needs a unit stride on its last dim; got {t.stride()}"
    num_cuts = check_snapshots(snap_pos, snap_slots, S)
    tile = tile_tokens(chunk_size, N)
    y = torch.empty(T, H, P, dtype=x.dtype, device=x.device)
    if S == 0:
        return y
    BP, BN = max(16, next_power_of_2(P)), max(16, next_power_of_2(N))
    output_block_p = min(BP, 64 if N <= 128 else 32)  # head-dim columns per output tile
    prec = "tf32x3" if x.dtype == torch.float32 else "tf32"
    launch = launch or default_launch(T, S, H, G, P, N, tile, x.device)
    assert (H // G) % launch.heads_per_program == 0, f"{launch.heads_per_program} heads per program, {H // G} per group"
    NC = num_virtual_chunks(T, S, tile)
    dt_proc = torch.empty(H, T, dtype=torch.float32, device=x.device)
    dA_cum = torch.empty(H, T, dtype=torch.float32, device=x.device)
    h = torch.empty(NC, H, P, N, dtype=x.dtype, device=x.device)

    BH = min(16, next_power_of_2(H))
    _ssd_dt_kernel[(NC, cdiv(H, BH))](
        dt, A_log, dt_bias, dt_proc, dA_cum, cu_seqlens, dt.stride(0), float(dt_limit[0]), float(dt_limit[1]), T, S,
        H=H, BT=tile, BH=BH, BLOCK_N=64,
    )
    block_p = min(launch.state_block_p, BP)
    state_warps, state_stages = state_warps_stages(launch, x.dtype, snap_pos is not None)
    _ssd_chunk_state_kernel[(cdiv(P, block_p), H, S)](
        x, B, dt_proc, dA_cum, h, ssm_states, cu_seqlens, state_slots, has_initial_state,
        state_slots if snap_pos is None else snap_pos, state_slots if snap_slots is None else snap_slots,
        x.stride(0), x.stride(1), B.stride(0), B.stride(1), ssm_states.stride(0), T, num_cuts,
        H=H, G=G, P=P, N=N, BT=tile, BP=block_p, BN=BN, BC=next_power_of_2(max(num_cuts, 1)),
        BS=min(tile, SNAPSHOT_WINDOW), HAS_SNAP=snap_pos is not None, PREC=prec,
        num_warps=state_warps, num_stages=state_stages,
    )
    zz = x if z is None else z
    _ssd_chunk_output_kernel[(NC * H // launch.heads_per_program,)](
        x, B, C, zz, D, dt_proc, dA_cum, h, y, cu_seqlens,
        x.stride(0), x.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1), zz.stride(0), zz.stride(1),
        T, S, H=H, G=G, P=P, N=N, BT=tile, BP=output_block_p, BN=BN, HEADS=launch.heads_per_program,
        HAS_Z=z is not None, BLOCK_N=64, PREC=prec, num_warps=launch.output_warps, num_stages=launch.output_stages,
    )
    return y


def mamba2_prefill(
    *,
    x: torch.Tensor,
    dt: torch.Tensor,
    A_log: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    z: torch.Tensor | None,
    ssm_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    chunk_size: int = 256,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    snap_pos: torch.Tensor | None = None,
    snap_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton version of mamba2_prefill_ref (same arguments and result). x, dt, B, C, z may be
    strided views with a unit last stride (slices of one projection row); ssm_states [S, H, P, N]
    in any float dtype (math in fp32), contiguous within a slot, updated in place. The kernels cut
    sequences into chunks of `tile_tokens(chunk_size, N)` tokens (chunk_size rounded up to a power
    of two >= 16, capped at 128, or at 64 where N > 128): the result does not depend on the tiling beyond
    rounding. Scratch per call: dt and dA_cum [H, T] fp32, and one [H, P, N] state per chunk in x's
    dtype (for Nemotron-H-8B in bf16: 16 KiB per token at 128-token chunks, 0.5 GiB for 32768
    tokens). Returns y [T, H, P] in x's dtype. Snapshots are written by the sequential state kernel,
    which then steps over the chunks split at the cuts: a cut at a chunk's end costs the store of
    its state, a cut inside a chunk also one more [P, L] x [L, N] matmul per head; without them
    (None) the snapshot code is compiled out."""
    return _mamba2_prefill_fwd(x, dt, A_log, B, C, D, dt_bias, z, ssm_states, cu_seqlens, state_slots,
                               has_initial_state, chunk_size, dt_limit, snap_pos, snap_slots)


def mamba2_prefill_ref(
    *,
    x: torch.Tensor,
    dt: torch.Tensor,
    A_log: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    z: torch.Tensor | None,
    ssm_states: torch.Tensor,
    cu_seqlens: torch.Tensor,
    state_slots: torch.Tensor,
    has_initial_state: torch.Tensor,
    chunk_size: int = 256,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    snap_pos: torch.Tensor | None = None,
    snap_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """x: [T, H, P]; dt: [T, H]; A_log, D, dt_bias: [H] float32; B, C: [T, G, N]; z: [T, H, P] or
    None; ssm_states: [S, H, P, N]; cu_seqlens: [num_seqs + 1]; state_slots, has_initial_state:
    [num_seqs]. `chunk_size` is the kernel's tiling (the reference is sequential). Returns [T, H, P].

    snap_pos, snap_slots: [num_seqs, cuts] int32 or both None. snap_pos[i, c] = p (1 <= p <= the
    sequence's length) writes the state after its first p tokens to ssm_states[snap_slots[i, c]];
    -1 is no cut, valid cuts come first in strictly ascending order. Snapshot slots must differ from
    each other and from state_slots (else the result depends on the order of the writes)."""
    del chunk_size
    rep = x.shape[1] // B.shape[1]
    A = -torch.exp(A_log.float())
    dt_all = F.softplus(dt.float() + dt_bias.float()).clamp(*dt_limit)  # [T, H]
    y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
    bounds = cu_seqlens.tolist()
    cuts = snapshot_cuts(snap_pos, snap_slots, bounds)
    for i, slot in enumerate(state_slots.tolist()):
        start, end = bounds[i], bounds[i + 1]
        state = ssm_states[slot].float() if bool(has_initial_state[i]) else ssm_states.new_zeros(
            ssm_states.shape[1:], dtype=torch.float32)
        for t in range(start, end):
            d = dt_all[t]  # [H]
            bt = B[t].float().repeat_interleave(rep, dim=0)  # [H, N]
            ct = C[t].float().repeat_interleave(rep, dim=0)
            xt = x[t].float()  # [H, P]
            state = state * torch.exp(d * A)[:, None, None] + (d[:, None] * xt)[..., None] * bt[:, None, :]
            y[t] = torch.einsum("hpn,hn->hp", state, ct) + D.float()[:, None] * xt
            if t + 1 - start in cuts[i]:
                ssm_states[cuts[i][t + 1 - start]] = state.to(ssm_states.dtype)
        ssm_states[slot] = state.to(ssm_states.dtype)
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(x.dtype)
