"""The few-token fused MoE in one launch: the expert GEMVs of moe_gemv.py (the contract of fused_moe.py) with
the up and down products as work items of a single grid, so the down weights stream while the up products
are still being computed, and a MoE layer at decode costs one launch's ramp and tail instead of two.

Programs take their work item from a ticket (an atomic counter), not from their program id: every ticket
below a program's own is held by a program already running, which is what makes the waits below safe,
whatever order the hardware starts programs in.
  up items, tickets [0, U):  (a, i_n) -> inter[a, o_n] as moe_gemv.up_rows computes it; then the item counts
      itself in ready[a] (release).
  down items, tickets [U, U + D):  (a, i_n) -> loads w2[e_a] rows o_n whole (all of I in one tile) first,
      then waits until ready[a] says that every up item of assignment a is done, then
      parts[a, o_n] = w[a] * (rows . inter[a]) in float32. The last of token t's TOPK items for these columns
      adds the slots in slot order and finishes them as the combine does (moe_epilogue.sum_slots_if_last):
      deterministic, no float atomics.
Counters (triton_kernels/arrival_counters.py) come back to 0 within the launch: the program that takes the
last ticket resets the ticket counter; the last down item to pass ready[a] resets it.
  a = t * TOPK + j: an assignment (token t, slot j); U = T * TOPK * ceil(I / BLOCK_U) up items,
  D = T * TOPK * ceil(H / BLOCK_D) down items.
"""

import torch
import triton
import triton.language as tl

from triton_kernels.arrival_counters import arrival_counters, parts_scratch
from triton_kernels.fastest import graph_time
from triton_kernels.moe_epilogue import sum_slots_if_last
from triton_kernels.moe_gemv import _block_scaled, up_rows


@triton.jit
def _count_ready(ready, total):
    """Counts one item in ready (acquire and release at gpu scope); the last of the total resets it to 0."""
    if tl.atomic_add(ready, 1, sem="acq_rel") == total - 1:
        tl.atomic_xchg(ready, 0)


@triton.jit
def _down_rows(a, i_n, inter, w2, s2, ids, topk_weights, parts, ready, num_u, num_d, stride_inter, stride_we,
               stride_wh, stride_se, stride_sh, stride_parts, H, I, E, FP8_W: tl.constexpr, BLOCK_D: tl.constexpr,
               GD: tl.constexpr):
    """parts[a, o_n] = topk_weights[a] * (w2[e_a] rows o_n . inter[a]) in float32, once ready[a] counts the
    num_u up items of a. The weight tile [BLOCK_D, GD, 128] (GD * 128 >= I) is loaded before the wait. An
    expert held elsewhere adds 0 without waiting. Counts itself in ready[a] after the wait (its acquire)."""
    tl.static_assert(128 % BLOCK_D == 0)
    i_e = tl.load(ids + a).to(tl.int64)
    held = i_e < E
    i_e = tl.where(held, i_e, 0)
    o_n = i_n * BLOCK_D + tl.arange(0, BLOCK_D)
    m_n = o_n < H
    o_g = tl.arange(0, GD)
    o_k = o_g[:, None] * 128 + tl.arange(0, 128)[None, :]  # [GD, 128]
    m_k = o_k < tl.where(held, I, 0)
    b_w = tl.load(w2 + i_e * stride_we + o_n.to(tl.int64)[:, None, None] * stride_wh + o_k[None, :, :],
                  mask=m_n[:, None, None] & m_k[None, :, :], other=0.0)
    if held:
        while tl.load(ready + a, volatile=True) < num_u:
            pass
    _count_ready(ready + a, num_u + num_d)
    tl.debug_barrier()
    b_a = tl.load(inter + a.to(tl.int64) * stride_inter + o_k, mask=m_k, other=0.0, cache_modifier=".cg")
    b_a = b_a.to(tl.float32) * tl.load(topk_weights + a)
    b_a = _block_scaled(b_a[None, :, :], s2 + i_e * stride_se + (i_n * BLOCK_D // 128) * stride_sh + o_g,
                        o_g * 128 < I, FP8_W)
    acc = tl.sum(tl.sum(b_w.to(tl.float32) * b_a, 2), 1)
    tl.store(parts + a.to(tl.int64) * stride_parts + o_n, acc, mask=m_n)


@triton.jit
def _one_launch_kernel(x, w13, s13, w2, s2, inter, ids, topk_weights, parts, out, shared, shared_gate, counters,
                       stride_x, stride_w13e, stride_w13n, stride_s13e, stride_s13n, stride_inter, stride_w2e,
                       stride_w2h, stride_s2e, stride_s2h, stride_parts, stride_out, stride_shared, stride_gate,
                       H, I, E, ROWS, ROWS_BUCKET, TOPK: tl.constexpr, GATED: tl.constexpr, FP8_W: tl.constexpr,
                       ROW_SCALES: tl.constexpr, HAS_SHARED: tl.constexpr, HAS_GATE: tl.constexpr,
                       BLOCK_U: tl.constexpr, GU: tl.constexpr, BLOCK_D: tl.constexpr, GD: tl.constexpr):
    """One program per work item (module docstring). counters: [0] tickets, [1, 1 + ROWS) ready per
    assignment, then an arrival count per (token, down column block). ROWS_BUCKET keys the tuner."""
    num_u, num_d = tl.cdiv(I, BLOCK_U), tl.cdiv(H, BLOCK_D)
    total = ROWS * (num_u + num_d)
    ticket = tl.atomic_add(counters, 1, sem="relaxed")
    if ticket == total - 1:  # every other ticket is taken
        tl.atomic_xchg(counters, 0)
    ready = counters + 1
    if ticket < ROWS * num_u:
        a = ticket // num_u
        up_rows(a, ticket % num_u, x, w13, s13, inter, ids, stride_x, stride_w13e, stride_w13n, stride_s13e,
                stride_s13n, stride_inter, H, I, E, TOPK, GATED, FP8_W, ROW_SCALES, BLOCK_U, GU, 1)
        tl.debug_barrier()  # every thread's columns are stored before the count says so
        _count_ready(ready + a, num_u + num_d)
    else:
        d = ticket - ROWS * num_u
        a, i_n = d // num_d, d % num_d
        _down_rows(a, i_n, inter, w2, s2, ids, topk_weights, parts, ready, num_u, num_d, stride_inter, stride_w2e,
                   stride_w2h, stride_s2e, stride_s2h, stride_parts, H, I, E, FP8_W, BLOCK_D, GD)
        t = a // TOPK
        o_n = i_n * BLOCK_D + tl.arange(0, BLOCK_D)
        sum_slots_if_last(parts, stride_parts, ready + ROWS, t * num_d + i_n, t, o_n, o_n < H, out, stride_out,
                          shared, shared_gate, stride_shared, stride_gate, TOPK, HAS_SHARED, HAS_GATE)


MAX_K_BLOCKS = 16  # H and I up to 16 x 128: larger K makes single-row tiles and grids of 10^5 programs
MAX_ROWS = 40  # assignments (T * k): measured up to 35B-A3B's T = 4 and Qwen3-Next-80B's (40)


def supports(h: int, i: int, rows: int) -> bool:
    """Whether one_launch_moe takes experts of hidden size h and intermediate size i for `rows` assignments.
    (A Nemotron-H expert shape, H 2688 and I 1856, at T = 4: 109k programs of one-row tiles, did not finish
    within a minute on the H200; the waits are bounded by the ticket order, so it was not shown to deadlock.)"""
    return triton.cdiv(h, 128) <= MAX_K_BLOCKS and triton.cdiv(i, 128) <= MAX_K_BLOCKS and rows <= MAX_ROWS


def _tile(k: int, elements: int) -> tuple[int, int]:
    """(rows, G) of a tile of about `elements` weights holding a whole K (G x 128 >= k): rows a power of two
    from 1 to 128, so that they lie in one FP8 scale block."""
    g = triton.next_power_of_2(triton.cdiv(k, 128))
    return max(1, min(128, elements // (g * 128))), g


def _shaped(configs: list[triton.Config], named_args: dict, **_) -> list[triton.Config]:
    """The tuner's configs (TILE_U / TILE_D weights per program) made into row counts for this H and I."""
    shaped = []
    for c in configs:
        (bu, gu), (bd, gd) = _tile(named_args["H"], c.kwargs["TILE_U"]), _tile(named_args["I"], c.kwargs["TILE_D"])
        shaped.append(triton.Config(dict(BLOCK_U=bu, GU=gu, BLOCK_D=bd, GD=gd), num_warps=c.num_warps))
    return shaped


# Weights per program (whole K in one tile, loaded at once) and warps; first measured in
# bench/moe_down_variants.py against the two-launch GEMVs.
_TUNED_TILES = [(2048, 2048, 4), (4096, 4096, 4), (4096, 2048, 4), (2048, 4096, 4)]
_tuned = triton.autotune(
    configs=[triton.Config(dict(TILE_U=u, TILE_D=d), num_warps=w) for u, d, w in _TUNED_TILES],
    key=["H", "I", "ROWS_BUCKET", "TOPK", "GATED", "FP8_W", "HAS_SHARED", "HAS_GATE"],
    prune_configs_by={"early_config_prune": _shaped}, do_bench=graph_time)(_one_launch_kernel)


def one_launch_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, s13: torch.Tensor | None,
                   s2: torch.Tensor | None, topk_weights: torch.Tensor, topk_ids: torch.Tensor, gated: bool,
                   shared: torch.Tensor | None, shared_gate: torch.Tensor | None,
                   tiles: tuple[int, int, int] | None = None) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I or I, H]; w2 [E, H, I]; s13, s2: FP8 block scales or None; topk_weights [T, k]
    float32 contiguous; topk_ids [T, k] (E: an expert held elsewhere, adds nothing); shared [T, H] or None;
    shared_gate [T] or None -> [T, H] in x's dtype, as moe_gemv.expert_gemvs. Arguments are checked by the
    caller (fused_moe.py). tiles: (up weights, down weights per program, warps) instead of the tuned ones."""
    (t, h), (e, _, i), k = x.shape, w2.shape, topk_ids.shape[1]
    rows = t * k
    assert supports(h, i, rows), f"one launch takes H, I <= {128 * MAX_K_BLOCKS}, up to {MAX_ROWS} assignments"
    fp8 = s13 is not None
    s13, s2 = (s13, s2) if fp8 else (w13, w2)  # without FP8 the weights stand in, unread
    ids = topk_ids.reshape(-1).contiguous()
    inter = torch.empty((rows, i), dtype=x.dtype, device=x.device)
    parts = parts_scratch(x.device, rows * h).view(rows, h)
    out = torch.empty_like(x)
    if tiles is None and not x.is_cuda:  # the interpreter cannot time configs: small tiles
        tiles = (4096, 4096, 4)
    fewest_down_rows = min(_tile(i, d)[0] for _, d, _ in ([tiles] if tiles else _TUNED_TILES))
    counters = arrival_counters(x.device, 1 + rows + t * triton.cdiv(h, fewest_down_rows))
    args = (x, w13, s13, w2, s2, inter, ids, topk_weights, parts, out, shared, shared_gate, counters, x.stride(0),
            w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), inter.stride(0), w2.stride(0), w2.stride(1),
            s2.stride(0), s2.stride(1), parts.stride(0), out.stride(0), 0 if shared is None else shared.stride(0),
            0 if shared_gate is None else shared_gate.stride(0), h, i, e, rows, triton.next_power_of_2(rows))
    flags = dict(TOPK=k, GATED=gated, FP8_W=fp8, HAS_SHARED=shared is not None, HAS_GATE=shared_gate is not None)

    def grid(meta: dict) -> tuple[int]:
        return (rows * (triton.cdiv(i, meta["BLOCK_U"]) + triton.cdiv(h, meta["BLOCK_D"])),)

    # a gated w13's up rows I + o_n may straddle a 128-row scale block unless 128 divides I (rows: a power of 2)
    flags["ROW_SCALES"] = fp8 and gated and i % 128 != 0
    if tiles is None:
        _tuned[grid](*args, **flags, enable_fp_fusion=False)
    else:
        (bu, gu), (bd, gd) = _tile(h, tiles[0]), _tile(i, tiles[1])
        _one_launch_kernel[grid(dict(BLOCK_U=bu, BLOCK_D=bd))](*args, **flags, BLOCK_U=bu, GU=gu, BLOCK_D=bd, GD=gd,
                                                               num_warps=tiles[2], enable_fp_fusion=False)
    return out
