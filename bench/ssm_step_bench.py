"""Question: are our Mamba2 / Mamba-1 decode steps (state in a pool, through slots) at least as fast as
mamba_ssm's Triton selective_state_update?

SSM decode steps and the Mamba-1 prefill on one GPU: ours vs mamba_ssm's Triton
`selective_state_update` in the same run.

Shapes: Mamba2 at Nemotron-H-8B (128 heads, head_dim 64, d_state 128, 8 groups: 4 MiB of fp32 state
per request and layer), Mamba-1 at Jamba (8192 channels, d_state 16); bf16 inputs, fp32 states.

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/mamba_ssm-*.whl
    PYTHONPATH=/tmp/site python3 bench/ssm_step_bench.py [--no-tune]

mamba_ssm without its CUDA extensions: `MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE pip wheel
mamba-ssm==2.3.2.post1 --no-deps --no-build-isolation` builds a pure-Python wheel (about 0.2 MB). Its
package `__init__` imports compiled modules, so `load_mamba_triton` puts empty stand-ins for the
packages `mamba_ssm`, `mamba_ssm.ops` and `mamba_ssm.ops.triton` (with the real folders as their
paths) into sys.modules and imports only the Triton module files; they need einops (installed
on the H200 image, else carry a wheel of it too).

Ours reads strided views of the projection rows and updates a state pool (twice the batch plus 8
slots) in place through shuffled slot indices. The anchor gets the same input views and, as in
ANCHORS.md, a contiguous state batch (it also takes `state_batch_indices`; that timing is given as
"anchor via slots"). Decode ops are timed as GPU time with a cold L2 (a queue of calls behind a sleep
kernel: no host time between them, as under the CUDA graphs of serving); the eager table gives
triton's do_bench medians, which count host time whenever the GPU drains its queue, and the host
time per call. The Mamba-1 prefill (B1·T4096, B8·T4096) has no Triton anchor: its do_bench time is
given alone. "% BW" is the bytes that must move (state read + written, inputs, output) over the
time, as a share of the copy bandwidth measured in the same run. Every case checks ours and the
anchor against the torch reference (relative L2 error of outputs and states).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import types
from collections.abc import Callable

import torch
import triton

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.gdn_kernels import bench_ms, copy_bandwidth, gpu_ms, host_us, rel_err, sweep  # noqa: E402
from triton_kernels import selective_scan, ssm_step  # noqa: E402

H, P, N, G = 128, 64, 128, 8  # Nemotron-H-8B mamba2 mixer
DM, N1 = 8192, 16  # Jamba mamba mixer
DTYPE = torch.bfloat16
DECODE_BATCHES = [1, 8, 64, 256]
MAMBA1_PREFILLS = [(1, 4096), (8, 4096)]  # (sequences, tokens each)
DEVICE = "cuda"


def load_mamba_triton(module: str) -> types.ModuleType:
    """mamba_ssm.ops.triton.<module>, imported without running mamba_ssm's package __init__ files."""
    spec = importlib.util.find_spec("mamba_ssm")  # finds the package without importing it
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError("mamba_ssm is not installed (see this file's docstring)")
    root = spec.submodule_search_locations[0]
    for name, path in (("mamba_ssm", root), ("mamba_ssm.ops", os.path.join(root, "ops")),
                       ("mamba_ssm.ops.triton", os.path.join(root, "ops", "triton"))):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [path]
            sys.modules[name] = package
    return importlib.import_module(f"mamba_ssm.ops.triton.{module}")


try:
    selective_state_update = load_mamba_triton("selective_state_update").selective_state_update
    ANCHOR_MISSING = ""
except ImportError as e:
    selective_state_update, ANCHOR_MISSING = None, str(e)


def mamba2_inputs(batch: int, seed: int = 0) -> dict:
    """Nemotron-H decode inputs: z and dt are slices of the in_proj row [z | xBC | dt], x, B, C slices of
    the conv output [x | B | C] (all bf16), plus the per-head float32 parameters."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    proj = torch.randn(batch, 2 * H * P + 2 * G * N + H, generator=g, device=DEVICE, dtype=DTYPE)
    z, _, dt = proj.split([H * P, H * P + 2 * G * N, H], dim=-1)
    xbc = torch.randn(batch, H * P + 2 * G * N, generator=g, device=DEVICE, dtype=DTYPE)
    x, B, C = xbc.split([H * P, G * N, G * N], dim=-1)
    return dict(x=x.view(batch, H, P), dt=dt, B=B.view(batch, G, N), C=C.view(batch, G, N),
                z=z.view(batch, H, P),
                A_log=torch.empty(H, device=DEVICE).uniform_(0, 2.77, generator=g),  # A in [-16, -1]
                D=torch.randn(H, generator=g, device=DEVICE),
                dt_bias=torch.empty(H, device=DEVICE).uniform_(-4.6, -2.2, generator=g))  # dt ~ 0.01 .. 0.1


def mamba1_inputs(num_tokens: int, seed: int = 0) -> dict:
    """Jamba inputs: x and z are slices of the in_proj row [x | z], B and C of the x_proj row
    [dt_rank | B | C]; dt comes out of dt_proj with its bias (dt_bias None)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    xz = torch.randn(num_tokens, 2 * DM, generator=g, device=DEVICE, dtype=DTYPE)
    dbc = torch.randn(num_tokens, 256 + 2 * N1, generator=g, device=DEVICE, dtype=DTYPE)
    dt = (torch.randn(num_tokens, DM, generator=g, device=DEVICE) - 3).to(DTYPE)
    A_log = torch.log(torch.arange(1, N1 + 1, device=DEVICE, dtype=torch.float32)).repeat(DM, 1)  # S4D-real init
    return dict(x=xz[:, :DM], dt=dt, A_log=A_log.contiguous(), B=dbc[:, 256 : 256 + N1], C=dbc[:, 256 + N1 :],
                D=torch.ones(DM, device=DEVICE), dt_bias=None, z=xz[:, DM:])


def state_pool(num_slots: int, *shape: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return 0.1 * torch.randn(num_slots, *shape, generator=g, device=DEVICE)


def decode_row(op: str, batch: int, moved: int, copy_bw: float, run_ours: Callable, run_anchor: Callable | None,
               run_anchor_slots: Callable | None) -> dict:
    row = dict(op=op, shape=f"B={batch}", bw=lambda ms: moved / (ms * 1e-3) / copy_bw * 100)
    row["ours"] = gpu_ms(run_ours)
    row["eager"] = dict(ours=bench_ms(run_ours), ours_host=host_us(run_ours))
    if run_anchor is not None:
        row["anchor"] = gpu_ms(run_anchor)
        row["anchor_slots"] = gpu_ms(run_anchor_slots)
        row["eager"].update(anchor=bench_ms(run_anchor), anchor_host=host_us(run_anchor))
    return row


def mamba2_decode_case(batch: int, copy_bw: float, tune: bool, report) -> dict:
    kw = mamba2_inputs(batch, seed=batch)
    num_slots = 2 * batch + 8
    slots = torch.randperm(num_slots, device=DEVICE)[:batch].int()
    states = state_pool(num_slots, H, P, N)
    ours, ref = states.clone(), states.clone()
    y = ssm_step.mamba2_decode(**kw, ssm_states=ours, state_slots=slots)
    y_ref = ssm_step.mamba2_decode_ref(**kw, ssm_states=ref, state_slots=slots)
    err = f"y {rel_err(y, y_ref):.1e}, S {rel_err(ours, ref):.1e}"
    moved = batch * (2 * H * P * N * 4 + 2 * (3 * H * P + 2 * G * N + H))
    run_ours = lambda: ssm_step.mamba2_decode(**kw, ssm_states=states, state_slots=slots)  # noqa: E731
    run_anchor = run_anchor_slots = None
    err_anchor = "n/a"
    if selective_state_update is not None:
        # the anchor's head-tied form, as mamba_ssm's Mamba2 calls it: dt, dt_bias, A, D broadcast over head_dim
        a = dict(x=kw["x"], dt=kw["dt"][:, :, None].expand(-1, -1, P), A=(-kw["A_log"].exp())[:, None, None]
                 .expand(-1, P, N), B=kw["B"], C=kw["C"], D=kw["D"][:, None].expand(-1, P), z=kw["z"],
                 dt_bias=kw["dt_bias"][:, None].expand(-1, P), dt_softplus=True)
        batch_states = states[slots.long()].clone()  # contiguous [B, H, P, N], the states ours started from
        y_anchor = selective_state_update(batch_states, **a)
        err_anchor = f"y {rel_err(y_anchor, y_ref):.1e}, S {rel_err(batch_states, ref[slots.long()]):.1e}"
        run_anchor = lambda: selective_state_update(batch_states, **a)  # noqa: E731
        run_anchor_slots = lambda: selective_state_update(states, **a, state_batch_indices=slots)  # noqa: E731
    row = decode_row("mamba2 decode", batch, moved, copy_bw, run_ours, run_anchor, run_anchor_slots)
    row.update(err=err, err_anchor=err_anchor)
    if tune:
        configs = [(bp, w) for bp in (4, 8, 16, 32) for w in (1, 2, 4) if bp * N // (32 * w) in range(8, 129)]
        sweep(f"mamba2 decode B={batch}", str(ssm_step._mamba2_decode_config(batch, H, P, N)), row["ours"], configs,
              lambda c: ssm_step._mamba2_decode_fwd(kw["x"], kw["dt"], kw["A_log"], kw["B"], kw["C"], kw["D"],
                                                    kw["dt_bias"], kw["z"], states, slots, -1, (0.0, float("inf")),
                                                    BP=c[0], num_warps=c[1]),
              lambda ms: f"{row['bw'](ms):5.1f} % BW", report, timer=gpu_ms)
    return row


def mamba1_decode_case(batch: int, copy_bw: float, tune: bool, report) -> dict:
    kw = mamba1_inputs(batch, seed=batch)
    num_slots = 2 * batch + 8
    slots = torch.randperm(num_slots, device=DEVICE)[:batch].int()
    states = state_pool(num_slots, DM, N1)
    ours, ref = states.clone(), states.clone()
    y = ssm_step.mamba1_decode(**kw, ssm_states=ours, state_slots=slots)
    y_ref = ssm_step.mamba1_decode_ref(**kw, ssm_states=ref, state_slots=slots)
    err = f"y {rel_err(y, y_ref):.1e}, S {rel_err(ours, ref):.1e}"
    moved = batch * (2 * DM * N1 * 4 + 2 * (4 * DM + 2 * N1))
    run_ours = lambda: ssm_step.mamba1_decode(**kw, ssm_states=states, state_slots=slots)  # noqa: E731
    run_anchor = run_anchor_slots = None
    err_anchor = "n/a"
    if selective_state_update is not None:
        # dt_bias=None breaks this mamba_ssm version's launcher (it unpacks `*0`): zeros stand in for it
        a = dict(x=kw["x"], dt=kw["dt"], A=-kw["A_log"].exp(), B=kw["B"], C=kw["C"], D=kw["D"], z=kw["z"],
                 dt_bias=torch.zeros(DM, device=DEVICE), dt_softplus=True)
        batch_states = states[slots.long()].clone()
        y_anchor = selective_state_update(batch_states, **a)
        err_anchor = f"y {rel_err(y_anchor, y_ref):.1e}, S {rel_err(batch_states, ref[slots.long()]):.1e}"
        run_anchor = lambda: selective_state_update(batch_states, **a)  # noqa: E731
        run_anchor_slots = lambda: selective_state_update(states, **a, state_batch_indices=slots)  # noqa: E731
    row = decode_row("mamba1 decode", batch, moved, copy_bw, run_ours, run_anchor, run_anchor_slots)
    row.update(err=err, err_anchor=err_anchor)
    if tune:
        configs = [(16, 1), (32, 1), (32, 2), (64, 2), (64, 4), (128, 4), (128, 8), (256, 8)]
        sweep(f"mamba1 decode B={batch}", str(ssm_step._mamba1_decode_config(batch, DM, N1)), row["ours"], configs,
              lambda c: ssm_step._mamba1_decode_fwd(kw["x"], kw["dt"], kw["A_log"], kw["B"], kw["C"], kw["D"], None,
                                                    kw["z"], states, slots, -1, BD=c[0], num_warps=c[1]),
              lambda ms: f"{row['bw'](ms):5.1f} % BW", report, timer=gpu_ms)
    return row


def mamba1_prefill_case(num_seqs: int, seqlen: int, copy_bw: float, tune: bool, report) -> dict:
    total = num_seqs * seqlen
    kw = mamba1_inputs(total, seed=total + num_seqs)
    num_slots = num_seqs + 4
    slots = torch.randperm(num_slots, device=DEVICE)[:num_seqs].int()
    cu = torch.arange(0, total + 1, seqlen, device=DEVICE, dtype=torch.int32)
    has_init = torch.ones(num_seqs, dtype=torch.bool, device=DEVICE)
    states = state_pool(num_slots, DM, N1)
    args = dict(**kw, cu_seqlens=cu, state_slots=slots, has_initial_state=has_init)
    row = dict(op="mamba1 prefill", shape=f"B{num_seqs}·T{seqlen}")
    check = dict(args, cu_seqlens=cu[:2], state_slots=slots[:1], has_initial_state=has_init[:1])  # sequence 0
    check.update({k: kw[k][:seqlen] for k in ("x", "dt", "B", "C", "z")})
    ours, ref = states.clone(), states.clone()
    y = selective_scan.mamba1_prefill(**check, ssm_states=ours)
    y_ref = selective_scan.mamba1_prefill_ref(**check, ssm_states=ref)
    row["err"] = f"y {rel_err(y, y_ref):.1e}, S {rel_err(ours, ref):.1e} (sequence 0)"
    row["ours"] = bench_ms(lambda: selective_scan.mamba1_prefill(**args, ssm_states=states))
    moved = total * DM * 2 * 4 + num_seqs * 2 * DM * N1 * 4  # x, dt, z in and y out; states in and out
    row["bw"] = lambda ms: moved / (ms * 1e-3) / copy_bw * 100
    if tune:
        configs = [(bd, w) for bd in (8, 16, 32, 64) for w in (1, 2)]
        sweep(f"mamba1 prefill {row['shape']} (BD, num_warps)", str(selective_scan._prefill_config(num_seqs, DM, N1)),
              row["ours"], configs, lambda c: selective_scan._mamba1_prefill_fwd(
                  kw["x"], kw["dt"], kw["A_log"], kw["B"], kw["C"], kw["D"], None, kw["z"], states, cu, slots,
                  has_init, BD=c[0], num_warps=c[1]),
              lambda ms: f"{row['bw'](ms):5.1f} % BW", report)
    return row


def table(decode_rows: list[dict], prefill_rows: list[dict]) -> str:
    lines = ["| op | shape | ours ms | anchor ms | anchor/ours | anchor via slots ms | ours % BW | anchor % BW "
             "| ours vs ref | anchor vs ref |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in decode_rows:
        has = "anchor" in r
        lines.append(" | ".join([
            f"| {r['op']}", r["shape"], f"{r['ours']:.4f}", f"{r['anchor']:.4f}" if has else "n/a",
            f"{r['anchor'] / r['ours']:.2f}x" if has else "n/a", f"{r['anchor_slots']:.4f}" if has else "n/a",
            f"{r['bw'](r['ours']):.1f}", f"{r['bw'](r['anchor']):.1f}" if has else "n/a",
            r["err"], r["err_anchor"]]) + " |")
    lines += ["", "| op | shape | ours ms (do_bench) | ours % BW | ours vs ref |", "|---|---|---|---|---|"]
    for r in prefill_rows:
        lines.append(f"| {r['op']} | {r['shape']} | {r['ours']:.3f} | {r['bw'](r['ours']):.1f} | {r['err']} |")
    lines += ["", "Eager calls (do_bench median; host us: Python, checks and launch per call)", "",
              "| op | shape | ours GPU ms | ours do_bench ms | ours host us | anchor GPU ms | anchor do_bench ms "
              "| anchor host us |", "|---|---|---|---|---|---|---|---|"]
    for r in decode_rows:
        e = r["eager"]
        anchor = ([f"{r['anchor']:.4f}", f"{e['anchor']:.4f}", f"{e['anchor_host']:.0f}"] if "anchor" in e
                  else ["n/a"] * 3)
        lines.append(" | ".join([f"| {r['op']}", r["shape"], f"{r['ours']:.4f}", f"{e['ours']:.4f}",
                                 f"{e['ours_host']:.0f}", *anchor]) + " |")
    return "\n".join(lines)


def run(report: Callable[[str], None] = print, tune: bool = True) -> list[dict]:
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    anchor = "mamba_ssm selective_state_update" if selective_state_update is not None else \
        f"anchor n/a: {ANCHOR_MISSING}"
    report(f"{props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}, triton {triton.__version__}; "
           f"{anchor}")
    copy_bw = copy_bandwidth()
    report(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)")
    report(f"mamba2 H {H}, P {P}, N {N}, G {G}; mamba1 Dm {DM}, N {N1}; bf16 inputs, fp32 states")
    decode_rows = [mamba2_decode_case(b, copy_bw, tune, report) for b in DECODE_BATCHES]
    decode_rows += [mamba1_decode_case(b, copy_bw, tune, report) for b in DECODE_BATCHES]
    prefill_rows = [mamba1_prefill_case(n, t, copy_bw, tune, report) for n, t in MAMBA1_PREFILLS]
    report("")
    report(table(decode_rows, prefill_rows))
    return decode_rows + prefill_rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-tune", action="store_true", help="skip timing our kernels under other launch configs")
    run(print, tune=not ap.parse_args().no_tune)
