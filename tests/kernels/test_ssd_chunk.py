"""mamba2_prefill (Triton) vs mamba2_prefill_ref (the token-by-token recurrence), called by keyword.

CPU runs the Triton interpreter in float32 on tiny odd shapes with small chunks (16 tokens), so
sequences of 1, chunk - 1, chunk + 1 and 2 * chunk + 3 tokens cover partial, whole and several
chunks. Inputs are strided views of one projection row, as the Mamba2 mixer passes them; the state
pool has unordered slots and sequences with and without an initial state share a batch.
"""

import pytest
import torch

from tests.kernels.sm90 import compile_sm90_in_subprocess
from triton_kernels import ssd_chunk
from triton_kernels.ssd_chunk import SSDLaunch, _mamba2_prefill_fwd, mamba2_prefill, mamba2_prefill_ref
from triton_kernels.ssm_step import mamba2_decode_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = dict(atol=1e-4, rtol=1e-4)  # float32; the chunked form sums in another order
PER_TOKEN = ("x", "dt", "B", "C", "z")


def ssd_inputs(num_tokens, heads, groups, head_dim, state, *, gated=True, dtype=torch.float32, seed=0):
    """Keyword arguments of mamba2_prefill without the pool and batch: x, z, B, C, dt are slices of
    one projection row [z | x | B | C | dt] that starts 3 elements into its buffer."""
    g = torch.Generator().manual_seed(seed)
    sizes = [heads * head_dim, heads * head_dim, groups * state, groups * state, heads]
    proj = torch.randn(num_tokens, sum(sizes) + 3, generator=g).to(device=DEVICE, dtype=dtype)
    z, x, B, C, dt = proj[:, 3:].split(sizes, dim=-1)
    return dict(
        x=x.view(num_tokens, heads, head_dim), dt=dt,
        A_log=torch.empty(heads).uniform_(-4, 0.5, generator=g).to(DEVICE),  # some heads remember long
        B=B.view(num_tokens, groups, state), C=C.view(num_tokens, groups, state),
        D=torch.randn(heads, generator=g).to(DEVICE),
        dt_bias=torch.empty(heads).uniform_(-1, 1, generator=g).to(DEVICE),
        z=z.view(num_tokens, heads, head_dim) if gated else None,
    )


def pool(num_slots, heads, head_dim, state, *, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (0.5 * torch.randn(num_slots, heads, head_dim, state, generator=g)).to(device=DEVICE, dtype=dtype)


def batch_args(lens, slots, has_init):
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lens).cumsum(0)
    return dict(cu_seqlens=cu.to(DEVICE), state_slots=torch.tensor(slots, dtype=torch.int32, device=DEVICE),
                has_initial_state=torch.tensor(has_init, device=DEVICE))


def rows(x, start, end):
    """Token rows [start, end) of every per-token input (the per-head parameters stay whole)."""
    return {k: v[start:end] if k in PER_TOKEN and v is not None else v for k, v in x.items()}


def rows_at(x, index):
    """The per-token inputs at token indices `index` (a gather: no longer views of one row)."""
    index = index.to(DEVICE)
    return {k: v[index] if k in PER_TOKEN and v is not None else v for k, v in x.items()}


def check(x, lens, slots, has_init, states, chunk_size, **kw):
    """Runs both on copies of the pool; compares outputs and the whole pool (written slots and
    the untouched ones)."""
    args = batch_args(lens, slots, has_init)
    ours, ref = states.clone(), states.clone()
    y = mamba2_prefill(**x, **args, ssm_states=ours, chunk_size=chunk_size, **kw)
    y_ref = mamba2_prefill_ref(**x, **args, ssm_states=ref, chunk_size=chunk_size, **kw)
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(ours, ref, **TOL)
    return y


CASES = [  # (lens, heads, groups, head_dim, state, chunk_size)
    ([1], 1, 1, 16, 16, 16),
    ([15, 17, 35, 1], 4, 2, 16, 16, 16),  # chunk - 1, chunk + 1, 2 chunk + 3, 1
    ([35], 4, 1, 8, 24, 16),  # head_dim and state below and between tile sizes (masked)
    ([16, 3, 40], 2, 2, 32, 16, 32),
    ([130, 9], 2, 1, 16, 16, 256),  # the kernels tile 256-token chunks by 128
    ([20, 17], 2, 1, 80, 40, 16),  # head_dim over the output kernel's 64-column blocks
    ([70], 2, 1, 16, 144, 128),  # d_state above 128: 64-token tiles
]


@pytest.mark.parametrize("gated", [True, False], ids=["z", "no_z"])
@pytest.mark.parametrize("lens,heads,groups,head_dim,state,chunk_size", CASES)
def test_prefill_matches_ref(lens, heads, groups, head_dim, state, chunk_size, gated):
    x = ssd_inputs(sum(lens), heads, groups, head_dim, state, gated=gated)
    states = pool(7, heads, head_dim, state)
    check(x, lens, [4, 0, 6, 2][: len(lens)], [True, False, True, True][: len(lens)], states, chunk_size)


def test_prefill_dt_limit():
    """A dt clamp that binds on both sides (the unclamped result differs, so the limit is applied)."""
    x = ssd_inputs(40, 2, 1, 16, 16, seed=2)
    states = pool(3, 2, 16, 16)
    y = check(x, [21, 19], [2, 0], [True, False], states, 16, dt_limit=(0.3, 0.9))
    y_free = mamba2_prefill_ref(**x, **batch_args([21, 19], [2, 0], [True, False]), ssm_states=states.clone())
    assert (y - y_free).abs().max() > 1e-2


def test_prefill_empty_sequence_and_pool_view():
    """A zero-length sequence still hands its state through (zeros without an initial state); the
    pool is a strided layer view ([S, layers, H, P, N][:, 1]) and bf16 (cast on load and store)."""
    x = ssd_inputs(23, 2, 2, 16, 16, seed=4)
    layers = pool(5, 2 * 2, 16, 16).view(5, 2, 2, 16, 16)
    args = batch_args([3, 0, 20], [1, 3, 4], [True, False, True])
    ours, ref = layers.clone(), layers.clone()
    y = mamba2_prefill(**x, **args, ssm_states=ours[:, 1], chunk_size=16)
    y_ref = mamba2_prefill_ref(**x, **args, ssm_states=ref[:, 1], chunk_size=16)
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(ours, ref, **TOL)
    assert (ours[3, 1] == 0).all()

    lo = layers.bfloat16()
    ours, ref = lo.clone(), lo.clone()
    y = mamba2_prefill(**x, **args, ssm_states=ours[:, 1], chunk_size=16)
    y_ref = mamba2_prefill_ref(**x, **args, ssm_states=ref[:, 1], chunk_size=16)
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(ours.float(), ref.float(), atol=1e-2, rtol=1e-2)  # one bf16 rounding apart


def test_prefill_ignores_states_without_initial_state():
    """A slot without an initial state may hold anything (NaN here): it must not be read."""
    x = ssd_inputs(20, 2, 1, 16, 16, seed=3)
    states = pool(4, 2, 16, 16)
    states[1] = float("nan")
    args = batch_args([4, 16], [1, 3], [False, True])
    ours, ref = states.clone(), states.clone()
    y = mamba2_prefill(**x, **args, ssm_states=ours, chunk_size=16)
    y_ref = mamba2_prefill_ref(**x, **args, ssm_states=ref, chunk_size=16)
    assert torch.isfinite(y).all() and torch.isfinite(ours[1]).all()
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(ours, ref, **TOL)


def test_prefill_half_precision_inputs():
    """fp16 inputs take the low-precision path of bf16 serving (matmul operands and the per-chunk
    states in the input dtype, fp32 accumulation and fp32 state; the interpreter mishandles bf16
    matmuls, fp16 stands in): close to the reference run on the same values in float32."""
    lens = [15, 40]
    x = ssd_inputs(sum(lens), 4, 2, 16, 16, dtype=torch.float16, seed=8)
    states = pool(3, 4, 16, 16)
    args = batch_args(lens, [2, 0], [True, False])
    ours, ref = states.clone(), states.clone()
    y = mamba2_prefill(**x, **args, ssm_states=ours, chunk_size=16)
    y_ref = mamba2_prefill_ref(**{k: v.float() if k in PER_TOKEN else v for k, v in x.items()}, **args,
                               ssm_states=ref)
    assert y.dtype == torch.float16
    assert (y.float() - y_ref).norm() / y_ref.norm() < 1e-3  # fp16 rounds at 2^-11 = 4.9e-4
    assert (ours - ref).norm() / ref.norm() < 1e-3


@pytest.mark.parametrize("launch", [
    SSDLaunch(state_block_p=16, state_warps=4, state_stages=1, heads_per_program=1, output_warps=4, output_stages=1),
    SSDLaunch(state_block_p=32, state_warps=4, state_stages=2, heads_per_program=2, output_warps=4, output_stages=1),
    SSDLaunch(state_block_p=64, state_warps=4, state_stages=2, heads_per_program=4, output_warps=4, output_stages=1),
], ids=["p16_h1", "p32_h2", "p64_h4"])
def test_launch_configs(launch):
    """The state kernel's P blocks and the output kernel's heads per program change nothing."""
    lens, heads, groups, head_dim, state = [18, 33], 8, 2, 32, 16
    x = ssd_inputs(sum(lens), heads, groups, head_dim, state, seed=6)
    states = pool(3, heads, head_dim, state)
    args = batch_args(lens, [2, 0], [True, True])
    ours, ref = states.clone(), states.clone()
    y = _mamba2_prefill_fwd(**x, **args, ssm_states=ours, chunk_size=16, dt_limit=(0.0, float("inf")),
                            launch=launch)
    y_ref = mamba2_prefill_ref(**x, **args, ssm_states=ref)
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(ours, ref, **TOL)


@pytest.mark.parametrize("chunk_size", [8, 48])
def test_prefill_any_chunk_size(chunk_size):
    """Config chunk sizes that are not tiles (below 16, not a power of two) run as the next tile."""
    x = ssd_inputs(37, 2, 1, 16, 16)
    check(x, [20, 17], [1, 0], [True, False], pool(2, 2, 16, 16), chunk_size)


def test_prefill_rejects_nonpositive_chunk_size():
    x = ssd_inputs(4, 1, 1, 16, 16)
    with pytest.raises(ValueError, match="chunk_size"):
        mamba2_prefill(**x, **batch_args([4], [0], [False]), ssm_states=pool(1, 1, 16, 16), chunk_size=0)


@pytest.mark.parametrize("prefix", [1, 16, 35])
def test_prefill_then_decode(prefix):
    """Serving: prefill a prefix with the kernel, decode the rest token by token (mamba2_decode_ref),
    equals the reference over the whole sequence (outputs and final state)."""
    total, heads, groups = prefix + 5, 4, 2
    x = ssd_inputs(total, heads, groups, 16, 16, seed=11)
    states = pool(5, heads, 16, 16)
    ref = states.clone()
    y_ref = mamba2_prefill_ref(**x, **batch_args([total], [3], [True]), ssm_states=ref)
    ours = states.clone()
    outs = [mamba2_prefill(**rows(x, 0, prefix), **batch_args([prefix], [3], [True]), ssm_states=ours, chunk_size=16)]
    slot = torch.tensor([3], dtype=torch.int32, device=DEVICE)
    for t in range(prefix, total):
        outs.append(mamba2_decode_ref(**rows(x, t, t + 1), ssm_states=ours, state_slots=slot, pad_slot=4))
    torch.testing.assert_close(torch.cat(outs), y_ref, **TOL)
    torch.testing.assert_close(ours, ref, **TOL)


@pytest.mark.parametrize("split", [5, 16, 30])
def test_prefill_in_pieces(split):
    """Chunked prefill: the prompt in two pieces, the second continuing from the slot, equals one
    piece, for a fresh request next to one continuing its own state in the same batches."""
    total, heads, groups = 50, 4, 2
    x = ssd_inputs(total, heads, groups, 16, 16, seed=13)
    other = ssd_inputs(3, heads, groups, 16, 16, seed=14)
    states = pool(4, heads, 16, 16)
    whole, pieces = states.clone(), states.clone()
    y_whole = mamba2_prefill(**x, **batch_args([total], [1], [False]), ssm_states=whole, chunk_size=16)
    outs = []
    for (start, end), init in (((0, split), False), ((split, total), True)):
        batch = {k: torch.cat([v[start:end], other[k][:3]]) if k in PER_TOKEN else v for k, v in x.items()}
        y = mamba2_prefill(**batch, **batch_args([end - start, 3], [1, 3], [init, True]), ssm_states=pieces,
                           chunk_size=16)
        outs.append(y[: end - start])
    torch.testing.assert_close(torch.cat(outs), y_whole, **TOL)
    torch.testing.assert_close(pieces[1], whole[1], **TOL)


# ---------------------------------------------------------------- snapshots inside a prefill


def snapshot_args(cuts, first_slot):
    """snap_pos / snap_slots for cuts [[p, ...] per sequence]: consecutive slots from first_slot,
    rows padded with -1 (the padded slots are -1 too: never read). Returns (kwargs, [(seq, p, slot)])."""
    width = max(1, max(len(c) for c in cuts))
    pos = torch.full((len(cuts), width), -1, dtype=torch.int32)
    slots = torch.full((len(cuts), width), -1, dtype=torch.int32)
    flat, slot = [], first_slot
    for i, row in enumerate(cuts):
        for j, p in enumerate(row):
            pos[i, j], slots[i, j] = p, slot
            flat.append((i, p, slot))
            slot += 1
    return dict(snap_pos=pos.to(DEVICE), snap_slots=slots.to(DEVICE)), flat


SNAP_CASES = [  # (lens, cuts per sequence, has_init, heads, groups, head_dim, chunk_size, gated)
    # p = 1 and the sequence end; no cut; chunk ends; inside, at and just past chunk ends; two
    # cuts inside one chunk
    ([5, 31, 32, 33, 70], [[1, 5], [], [16, 32], [7, 16, 17, 33], [3, 9, 40, 64]],
     [True, False, True, False, True], 2, 1, 16, 16, True),
    # 32-token chunks, two P blocks of the state kernel, no gate
    ([70, 33, 5], [[31, 32, 33, 69], [1], []], [False, True, True], 2, 2, 32, 32, False),
    # 128-token chunks updated in 64-token windows: cuts at window ends inside a chunk, at chunk ends,
    # inside windows of either half, one token before the end and at it
    ([300, 130], [[64, 96, 128, 192, 256, 299], [1, 64, 127, 130]], [True, False], 2, 1, 16, 128, True),
]


@pytest.mark.parametrize("window", [128, 64])  # the state kernel's update windows with cuts (SNAPSHOT_WINDOW)
@pytest.mark.parametrize("lens,cuts,has_init,heads,groups,head_dim,chunk_size,gated", SNAP_CASES)
def test_prefill_snapshots(lens, cuts, has_init, heads, groups, head_dim, chunk_size, gated, window, monkeypatch):
    """Snapshots of the state after p tokens, written by the kernel into their slots: (a) kernel ==
    reference on the whole pool, outputs and final states as without cuts; (b) the reference's
    snapshot == the reference's final state over the first p tokens alone; (c) the kernel
    continuing from a snapshot over the remaining tokens == the uncut run (outputs, final state)."""
    if window < 128 and chunk_size <= window:
        pytest.skip("windows as large as the chunks: the same kernel as the default window's case")
    monkeypatch.setattr(ssd_chunk, "SNAPSHOT_WINDOW", window)
    x = ssd_inputs(sum(lens), heads, groups, head_dim, 16, gated=gated, seed=21)
    slots = [3, 0, 5, 1, 4][: len(lens)]
    snap, flat = snapshot_args(cuts, first_slot=6)
    states = pool(6 + len(flat) + 1, heads, head_dim, 16)  # one slot more that nothing writes
    args = batch_args(lens, slots, has_init)

    ours, ref, uncut = states.clone(), states.clone(), states.clone()
    y = mamba2_prefill(**x, **args, ssm_states=ours, chunk_size=chunk_size, **snap)
    y_ref = mamba2_prefill_ref(**x, **args, ssm_states=ref, **snap)
    y_uncut = mamba2_prefill(**x, **args, ssm_states=uncut, chunk_size=chunk_size)
    torch.testing.assert_close(y, y_ref, **TOL)  # (a)
    torch.testing.assert_close(ours, ref, **TOL)
    torch.testing.assert_close(y, y_uncut, **TOL)
    torch.testing.assert_close(ours[:6], uncut[:6], **TOL)
    assert torch.equal(ours[-1], states[-1])

    # (b) and (c) as one batch each: sequence k of the batch is cut k's prefix or remainder
    bounds = args["cu_seqlens"].tolist()
    prefix_rows = [torch.arange(bounds[i], bounds[i] + p) for i, p, _ in flat]
    rest_rows = [torch.arange(bounds[i] + p, bounds[i + 1]) for i, p, _ in flat]
    prefixes = states.clone()
    prefixes[6:6 + len(flat)] = states[[slots[i] for i, _, _ in flat]]  # each cut's initial state
    mamba2_prefill_ref(**rows_at(x, torch.cat(prefix_rows)), ssm_states=prefixes,
                       **batch_args([len(r) for r in prefix_rows], [s for _, _, s in flat],
                                    [has_init[i] for i, _, _ in flat]))
    torch.testing.assert_close(ref[6:6 + len(flat)], prefixes[6:6 + len(flat)], **TOL)

    rest = ours.clone()
    y_rest = mamba2_prefill(**rows_at(x, torch.cat(rest_rows)), ssm_states=rest, chunk_size=chunk_size,
                            **batch_args([len(r) for r in rest_rows], [s for _, _, s in flat], [True] * len(flat)))
    torch.testing.assert_close(y_rest, y_uncut[torch.cat(rest_rows).to(DEVICE)], **TOL)
    torch.testing.assert_close(rest[[s for _, _, s in flat]], uncut[[slots[i] for i, _, _ in flat]], **TOL)


def test_prefill_snapshots_dt_limit_and_bf16_pool():
    """The cut's update uses the same processed dt (clamped here on both sides); a bf16 pool gets
    the snapshot rounded once, like the final state."""
    lens, cuts = [40, 21], [[5, 16, 39], [21]]
    x = ssd_inputs(sum(lens), 2, 1, 16, 16, seed=22)
    snap, flat = snapshot_args(cuts, first_slot=2)
    states = pool(2 + len(flat), 2, 16, 16)
    check(x, lens, [1, 0], [True, False], states, 16, dt_limit=(0.3, 0.9), **snap)
    args = batch_args(lens, [1, 0], [True, False])
    ours, ref = states.bfloat16(), states.bfloat16()
    mamba2_prefill(**x, **args, ssm_states=ours, chunk_size=16, dt_limit=(0.3, 0.9), **snap)
    mamba2_prefill_ref(**x, **args, ssm_states=ref, dt_limit=(0.3, 0.9), **snap)
    torch.testing.assert_close(ours.float(), ref.float(), atol=1e-2, rtol=1e-2)  # one bf16 rounding apart


def test_prefill_snapshot_ref_rejects_bad_rows():
    """The reference checks what the kernel trusts: cuts strictly ascending, first, within the sequence."""
    x = ssd_inputs(10, 1, 1, 16, 16)
    args = batch_args([10], [0], [False])
    for row in ([4, 3], [3, 3], [-1, 3], [11], [0]):
        snap = dict(snap_pos=torch.tensor([row], dtype=torch.int32, device=DEVICE),
                    snap_slots=torch.ones(1, len(row), dtype=torch.int32, device=DEVICE))
        with pytest.raises(AssertionError, match="snap_pos row 0"):
            mamba2_prefill_ref(**x, **args, ssm_states=pool(2, 1, 16, 16), **snap)


SSD_SM90 = r'''
from triton_kernels import ssd_chunk, ssd_chunk_parts as parts

def types(dtype):
    t = dict(x=dtype, B=dtype, C=dtype, z=dtype, h=dtype, y=dtype, dt="*fp32", dA_cum="*fp32", dt_out="*fp32",
             A_log="*fp32", D="*fp32", dt_bias="*fp32", ssm_states="*fp32", cu_seqlens="*i32", state_slots="*i32",
             has_initial_state="*i1", snap_pos="*i32", snap_slots="*i32", dt_lo="fp32", dt_hi="fp32")
    return t, dict(t, dt=dtype)  # the dt kernel reads the model's dt

def build(tag, dtype, H, G, P, N, chunk_size, num_tokens, num_seqs, prec):
    torch_dtype = torch.float32 if dtype == "*fp32" else torch.bfloat16
    kernel_types, dt_types = types(dtype)
    tile = ssd_chunk.tile_tokens(chunk_size, N)
    launch = ssd_chunk.default_launch(num_tokens, num_seqs, H, G, P, N, tile, torch.device("cpu"))  # 132 SMs
    dims = dict(H=H, G=G, P=P, N=N, BT=tile)
    BP, BN = max(16, triton.next_power_of_2(P)), max(16, triton.next_power_of_2(N))
    output_bp = min(BP, 64 if N <= 128 else 32)  # as the launcher picks it
    out[f"{tag} dt"] = compile_sm90(parts._ssd_dt_kernel, dt_types, dict(H=H, BT=tile, BH=16, BLOCK_N=64), 4, 1)
    for has_snap, window in [(False, tile), (True, tile)] + ([(True, 64)] if tile > 64 else []):
        out[f"{tag} state snap={has_snap} window={window} {launch}"] = compile_sm90(
            parts._ssd_chunk_state_kernel, kernel_types,
            dict(**dims, BP=min(launch.state_block_p, BP), BN=BN, BC=4 if has_snap else 1,
                 BS=window, HAS_SNAP=has_snap, PREC=prec),
            *ssd_chunk.state_warps_stages(launch, torch_dtype, has_snap))
    for has_z in (False, True):
        out[f"{tag} output z={has_z} {launch}"] = compile_sm90(
            parts._ssd_chunk_output_kernel, kernel_types,
            dict(**dims, BP=output_bp, BN=BN, HEADS=launch.heads_per_program, HAS_Z=has_z, BLOCK_N=64, PREC=prec),
            launch.output_warps, launch.output_stages)

for num_seqs, seqlen in ((1, 4096), (1, 32768), (8, 4096)):  # Nemotron-H-8B, the benchmark cases
    build(f"bf16 B{num_seqs}xT{seqlen}", "*bf16", 128, 8, 64, 128, 128, num_seqs * seqlen, num_seqs, "tf32")
build("falcon_h1-7b", "*bf16", 24, 1, 128, 256, 128, 32768, 1, "tf32")  # P 128, N 256
build("granite-4.0-h", "*bf16", 128, 1, 64, 128, 128, 32768, 8, "tf32")  # one group of 128 heads
build("f32 tiny", "*fp32", 4, 2, 16, 16, 128, 300, 3, "tf32x3")  # float32 GPU tests and tiny models
print(json.dumps(out))
'''


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel tests run the compiled kernels")
def test_kernels_compile_for_hopper_without_spills():
    """The SSD kernels build for sm_90a (Triton's CUDA backend and its ptxas run on CPU) with the launch
    configs the launcher picks at the benchmark shapes, in bf16 and float32, the state kernel with and
    without snapshots, without register spills: this catches what only the compiler sees (the
    interpreter runs the logic)."""
    results = compile_sm90_in_subprocess(SSD_SM90)
    spilling = {name: r for name, r in results.items() if r[1] > 0}
    assert not spilling, f"(registers, spilled bytes) of configs that spill: {spilling}"
    assert len(results) == 35 and all(regs <= 255 for regs, _ in results.values())
