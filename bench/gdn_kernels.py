"""Question: are our Gated DeltaNet kernels (decode, chunked prefill) and the causal conv1d at least as fast as
fla-core's, and how near the copy bandwidth, at the Qwen3.5-9B shapes?

Gated DeltaNet kernels on one GPU: ours vs fla-core in the same run, at the ANCHORS.md shapes
(Qwen3.5-9B linear attention: H_qk 16, H_v 32, K = V = 128, bf16 inputs, fp32 state; the conv over
[q k v]: 8192 channels, width 4, bf16 conv state).

    PYTHONPATH=. python bench/gdn_kernels.py [--no-tune] [--no-long] [--no-profile]

About 3 minutes with the tuning sweeps on a fresh Triton cache (most of it compiling), under a
minute with --no-tune.

Ours reads strided views of one projection row and updates the state pools in place through slot
indices; fla (imported if installed) gets contiguous inputs, contiguous states and precomputed gates
(untimed), as it needs. Decode-sized ops (GDN decode, conv update) are timed as GPU time with a
cold L2 (gpu_ms: the calls queue up behind a sleep kernel, so host time cannot fall between the
timing events; serving runs decode under CUDA graphs); a second table gives for them triton's
do_bench median, which counts host time whenever the GPU drains its queue between calls (for calls
of a few microseconds it came out bimodal, ~0.006 or ~0.045 ms for one kernel binary), and the host
time per call. Prefills, GPU-bound, are timed with do_bench. Ratios are fla's time / ours (> 1:
ours is faster). "% BW" is the bytes that must move (states read + written, inputs, outputs) over
the time, as a share of the copy bandwidth measured here. Every case also checks ours against the
torch reference at that shape (relative L2 error of outputs and states). The tuning sections time
our kernels under other launch configs, to check the built-in choices; the profile sections split
each prefill into its kernels and list the autotuners' timings.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
import triton
import triton.testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from triton_kernels import causal_conv1d as conv  # noqa: E402
from triton_kernels import gdn_chunk, gdn_recurrent  # noqa: E402

try:
    import fla
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
except ImportError as e:
    fla, FLA_MISSING = None, str(e)

HK, HV, K, V, WIDTH = 16, 32, 128, 128, 4
CONV_DIM = 2 * HK * K + HV * V
PROJ = CONV_DIM + HV * V + 2 * HV  # in_proj row: [q k v | z | b | a]
DTYPE = torch.bfloat16
DECODE_BATCHES = [1, 8, 64, 256]
PREFILL_CASES = [(1, 4096), (1, 32768), (8, 4096)]  # (sequences, tokens each)
STATE_BYTES = HV * K * V * 4
DEVICE = "cuda"


def bench_ms(fn: Callable) -> float:
    """triton's do_bench median: L2 flushed before each call, host time between calls included
    whenever the GPU runs out of queued work."""
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


_FLUSH: list[torch.Tensor] = []


def gpu_ms(fn: Callable, iters: int = 50) -> float:
    """Median GPU time of fn with a cold L2 and no host time: a sleep kernel holds the GPU while the
    host queues iters x (L2 flush, start event, fn, end event), so the calls run back to back."""
    if not _FLUSH:
        _FLUSH.append(torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE))
    flush = _FLUSH[0]
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(3):
        flush.zero_()
        fn()
    host_s = (time.perf_counter() - start) / 3  # an upper bound: it may include waits on the GPU
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    torch.cuda._sleep(int(2e9 * (2 * host_s * iters + 2e-3)))  # cycles, at about 2 GHz
    for begin, end in events:
        flush.zero_()
        begin.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(begin.elapsed_time(end) for begin, end in events)


def host_us(fn: Callable, iters: int = 200) -> float:
    """Host time per call of fn (Python, checks, allocation, launch), with the GPU never full."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / iters * 1e6


def copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/s, counting read + write."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device=DEVICE)
    y = torch.empty_like(x)
    return 2 * x.numel() / (bench_ms(lambda: y.copy_(x)) * 1e-3)


def copy_ms(num_bytes: int, timer: Callable = bench_ms) -> float:
    """Time of a device copy moving num_bytes in all (half read, half written)."""
    x = torch.empty(max(num_bytes // 2, 1), dtype=torch.uint8, device=DEVICE)
    y = torch.empty_like(x)
    return timer(lambda: y.copy_(x))


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def gdn_inputs(num_tokens: int, seed: int = 0) -> dict:
    """q, k, v, a, b as strided views of one bf16 projection (as the model passes them), and the
    per-head parameters."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    proj = torch.randn(num_tokens, PROJ, generator=g, device=DEVICE, dtype=DTYPE)
    q, k, v, _, b, a = proj.split([HK * K, HK * K, HV * V, HV * V, HV, HV], dim=-1)
    return dict(q=q.view(-1, HK, K), k=k.view(-1, HK, K), v=v.view(-1, HV, V), a=a, b=b,
                A_log=torch.empty(HV, device=DEVICE).uniform_(0, 2.77, generator=g),  # A in [1, 16]
                dt_bias=torch.empty(HV, device=DEVICE).uniform_(-4, -2, generator=g))


def fla_args(x: dict) -> dict:
    """fla's inputs: contiguous [1 or B, T, H, D], gates precomputed in float32."""
    g = -x["A_log"].exp() * F.softplus(x["a"].float() + x["dt_bias"])
    return dict(q=x["q"].contiguous(), k=x["k"].contiguous(), v=x["v"].contiguous(), g=g,
                beta=x["b"].float().sigmoid())


def state_pool(num_slots: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return 0.1 * torch.randn(num_slots, HV, K, V, generator=g, device=DEVICE)


def kernel_times(fn: Callable, iters: int = 5) -> list[tuple[str, float]]:
    """(kernel name, ms per call) of the GPU kernels fn launches, slowest first."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = collections.defaultdict(float)
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            totals[evt.name] += evt.time_range.elapsed_us() / 1e3 / iters
    return sorted(totals.items(), key=lambda kv: -kv[1])


def report_profile(name: str, fn: Callable, report) -> None:
    times = kernel_times(fn)
    report(f"  {name}: {sum(t for _, t in times):.3f} ms in kernels")
    for kernel, t in times[:8]:
        report(f"    {t:.3f} ms  {kernel[:90]}")


def sweep(title: str, default: str, base_ms: float, configs: list, call: Callable, metric: Callable, report,
          timer: Callable = bench_ms):
    results = []
    for cfg in configs:
        try:
            results.append((timer(lambda cfg=cfg: call(cfg)), cfg))
        except Exception as e:  # out of registers / shared memory
            report(f"  {title}: {cfg} failed: {type(e).__name__}")
    results.sort(key=lambda r: r[0])
    report(f"\n{title} tuning (default {default}: {base_ms:.3f} ms)")
    for ms, cfg in results[:6]:
        report(f"  {ms:.3f} ms  {metric(ms)}  {cfg}")


def decode_case(batch: int, copy_bw: float, tune: bool, report) -> dict:
    x = gdn_inputs(batch, seed=batch)
    num_slots = batch + 8
    pad = num_slots - 1
    slots = torch.randperm(num_slots - 1, device=DEVICE)[:batch].int()
    states = state_pool(num_slots)
    kw = dict(**x, state_slots=slots, pad_slot=pad)
    row = dict(op="GDN decode", shape=f"B={batch}")
    ours, ref, ref_init = states.clone(), states.clone(), states.clone()
    o = gdn_recurrent.gdn_decode(**kw, ssm_states=ours)
    o_ref = gdn_recurrent.gdn_decode_ref(**kw, ssm_states=ref)
    row["err"] = f"o {rel_err(o, o_ref):.1e}, S {rel_err(ours, ref):.1e}"
    run_ours = lambda: gdn_recurrent.gdn_decode(**kw, ssm_states=states)  # noqa: E731
    row["ours"] = gpu_ms(run_ours)
    row["eager"] = dict(ours=bench_ms(run_ours), ours_host=host_us(run_ours))
    moved = batch * (2 * STATE_BYTES + 2 * (2 * HK * K + 2 * HV * V + 2 * HV))
    row["bw"] = lambda ms: moved / (ms * 1e-3) / copy_bw * 100
    if fla is not None:
        f = {name: t.unsqueeze(1) for name, t in fla_args(x).items()}  # [B, 1, H, D]: one token per sequence
        h0 = ref_init[slots.long()].contiguous()  # the states ours started from

        def run_fla():
            return fused_recurrent_gated_delta_rule(**f, initial_state=h0, output_final_state=True,
                                                    use_qk_l2norm_in_kernel=True)
        o_fla, s_fla = run_fla()
        row["err_fla"] = f"o {rel_err(o_fla[:, 0], o_ref):.1e}, S {rel_err(s_fla, ref[slots.long()]):.1e}"
        row["fla"] = gpu_ms(run_fla)
        row["eager"].update(fla=bench_ms(run_fla), fla_host=host_us(run_fla))
    if tune:
        BV, warps = gdn_recurrent._decode_config(batch, HV, K, V)
        configs = [(bv, w) for bv in (8, 16, 32, 64) for w in (1, 2, 4, 8) if bv * K >= 32 * w * 4]
        sweep(f"GDN decode B={batch}", f"BV={BV}, num_warps={warps}", row["ours"], configs,
              lambda c: gdn_recurrent._gdn_decode_fwd(**x, ssm_states=states, state_slots=slots, pad_slot=pad,
                                                      scale=K**-0.5, BV=c[0], num_warps=c[1]),
              lambda ms: f"{row['bw'](ms):5.1f} % BW", report, timer=gpu_ms)
    return row


def prefill_case(num_seqs: int, seqlen: int, tune: bool, profile: bool, report) -> dict:
    total = num_seqs * seqlen
    x = gdn_inputs(total, seed=total + num_seqs)
    num_slots = num_seqs + 4
    slots = torch.randperm(num_slots, device=DEVICE)[:num_seqs].int()
    cu = torch.arange(0, total + 1, seqlen, device=DEVICE, dtype=torch.int32)
    has_init = torch.ones(num_seqs, dtype=torch.bool, device=DEVICE)
    states = state_pool(num_slots)
    kw = dict(**x, cu_seqlens=cu, state_slots=slots, has_initial_state=has_init)
    row = dict(op="GDN prefill", shape=f"B{num_seqs}·T{seqlen}")
    ours, ref, ref_init = states.clone(), states.clone(), states.clone()
    o = gdn_chunk.gdn_prefill(**kw, ssm_states=ours)
    o_ref = gdn_chunk.gdn_prefill_ref(**kw, ssm_states=ref)
    row["err"] = f"o {rel_err(o, o_ref):.1e}, S {rel_err(ours, ref):.1e}"
    del o_ref
    row["ours"] = bench_ms(lambda: gdn_chunk.gdn_prefill(**kw, ssm_states=states))
    run_fla = None
    if fla is not None:
        f = {name: t.unsqueeze(0) for name, t in fla_args(x).items()}  # [1, T, H, D], varlen through cu_seqlens
        h0 = ref_init[slots.long()].contiguous()  # the states ours started from
        cu_long = cu.long()
        run_fla = lambda: chunk_gated_delta_rule(**f, scale=K**-0.5, initial_state=h0,  # noqa: E731
                                                 output_final_state=True, cu_seqlens=cu_long,
                                                 use_qk_l2norm_in_kernel=True)
        try:
            o_fla, s_fla = run_fla()
        except Exception as e:  # an fla without grouped value heads: give it repeated q, k
            report(f"  fla chunk_gated_delta_rule with H={HK}, HV={HV} failed ({type(e).__name__}); "
                   f"timing it with q, k repeated to {HV} heads")
            f["q"], f["k"] = (f[n].repeat_interleave(HV // HK, dim=2) for n in ("q", "k"))
            o_fla, s_fla = run_fla()
        row["err_fla"] = f"o {rel_err(o_fla[0], o):.1e} vs ours, S {rel_err(s_fla, ref[slots.long()]):.1e}"
        row["fla"] = bench_ms(run_fla)
    if profile:
        report(f"\nGDN prefill {row['shape']} kernels")
        report_profile("ours", lambda: gdn_chunk.gdn_prefill(**kw, ssm_states=states), report)
        if run_fla is not None:
            report_profile("fla", run_fla, report)
        for name in ("_gdn_chunk_intra_kernel", "_gdn_chunk_output_kernel"):
            tuner = getattr(gdn_chunk, name)
            report(f"  {name} autotuned: {getattr(tuner, 'best_config', 'n/a')}")
            for cfg, t in sorted(getattr(tuner, "configs_timings", {}).items(), key=lambda kv: kv[1][0]):
                report(f"    {t[0]:.3f} ms  {cfg}")
    if tune:
        default = gdn_chunk._state_config(num_seqs, HV, V)
        configs = [(bv, w, s) for bv in (16, 32, 64) for w in (2, 4) for s in (2, 3)] + [(64, 8, 2), (32, 4, 1)]
        sweep(f"GDN prefill {row['shape']}, state kernel (BV, num_warps, num_stages)", str(default), row["ours"],
              configs, lambda c: gdn_chunk._gdn_prefill_fwd(**kw, ssm_states=states, scale=K**-0.5, state_config=c),
              lambda ms: f"{row['fla'] / ms:.2f}x fla" if "fla" in row else "", report)
    return row


def conv_weights(num_slots: int):
    g = torch.Generator(device=DEVICE).manual_seed(3)
    weight = (torch.randn(CONV_DIM, WIDTH, generator=g, device=DEVICE) / WIDTH).to(DTYPE)
    states = torch.randn(num_slots, WIDTH - 1, CONV_DIM, generator=g, device=DEVICE).to(DTYPE)
    return weight, states


def conv_decode_case(batch: int, copy_bw: float, tune: bool, report) -> dict:
    x = torch.randn(batch, PROJ, device=DEVICE, dtype=DTYPE)[:, :CONV_DIM]
    num_slots = batch + 8
    weight, states = conv_weights(num_slots)
    slots = torch.randperm(num_slots - 1, device=DEVICE)[:batch].int()
    kw = dict(x=x, weight=weight, bias=None, state_slots=slots, pad_slot=num_slots - 1)
    row = dict(op="conv1d update", shape=f"B={batch}")
    ours, ref = states.clone(), states.clone()
    y = conv.causal_conv1d_update(**kw, conv_states=ours)
    row["err"] = f"y {rel_err(y, conv.causal_conv1d_update_ref(**kw, conv_states=ref)):.1e}, " \
                 f"S {rel_err(ours, ref):.1e}"
    run_ours = lambda: conv.causal_conv1d_update(**kw, conv_states=states)  # noqa: E731
    row["ours"] = gpu_ms(run_ours)
    row["eager"] = dict(ours=bench_ms(run_ours), ours_host=host_us(run_ours))
    moved = batch * CONV_DIM * 2 * (2 * (WIDTH - 1) + 2)
    row["copy"] = copy_ms(moved, gpu_ms)
    row["bw"] = lambda ms: moved / (ms * 1e-3) / copy_bw * 100
    if tune:
        configs = [(bd, w) for bd in (256, 512, 1024, 2048) for w in (2, 4, 8) if bd >= 64 * w]
        sweep(f"conv1d update B={batch}", str(conv._update_config(batch)), row["ours"], configs,
              lambda c: conv._conv_update_fwd(x, weight, None, states, slots, num_slots - 1, "silu", BD=c[0],
                                              num_warps=c[1]),
              lambda ms: f"{row['bw'](ms):5.1f} % BW", report, timer=gpu_ms)
    return row


def conv_prefill_case(num_seqs: int, seqlen: int, copy_bw: float, tune: bool, report) -> dict:
    total = num_seqs * seqlen
    x = torch.randn(total, PROJ, device=DEVICE, dtype=DTYPE)[:, :CONV_DIM]
    num_slots = num_seqs + 4
    weight, states = conv_weights(num_slots)
    kw = dict(x=x, weight=weight, bias=None, state_slots=torch.randperm(num_slots, device=DEVICE)[:num_seqs].int(),
              cu_seqlens=torch.arange(0, total + 1, seqlen, device=DEVICE, dtype=torch.int32),
              has_initial_state=torch.ones(num_seqs, dtype=torch.bool, device=DEVICE))
    row = dict(op="conv1d prefill", shape=f"B{num_seqs}·T{seqlen}")
    ours, ref = states.clone(), states.clone()
    y = conv.causal_conv1d_prefill(**kw, conv_states=ours)
    row["err"] = f"y {rel_err(y, conv.causal_conv1d_prefill_ref(**kw, conv_states=ref)):.1e}, " \
                 f"S {rel_err(ours, ref):.1e}"
    row["ours"] = bench_ms(lambda: conv.causal_conv1d_prefill(**kw, conv_states=states))
    moved = total * CONV_DIM * 2 * 2 + num_seqs * (WIDTH - 1) * CONV_DIM * 2 * 2
    row["copy"] = copy_ms(moved)
    row["bw"] = lambda ms: moved / (ms * 1e-3) / copy_bw * 100
    if tune:
        configs = [(16, 256, 4), (32, 128, 4), (32, 256, 8), (64, 64, 4), (64, 128, 4), (64, 128, 8), (128, 64, 8)]
        sweep(f"conv1d prefill {row['shape']}", str(conv._prefill_config()), row["ours"], configs,
              lambda c: conv._conv_prefill_fwd(kw["x"], weight, None, states, kw["cu_seqlens"], kw["state_slots"],
                                               kw["has_initial_state"], "silu", BT=c[0], BD=c[1], num_warps=c[2]),
              lambda ms: f"{row['bw'](ms):5.1f} % BW", report)
    return row


def table(gdn_rows: list[dict], conv_rows: list[dict]) -> str:
    lines = ["| op | shape | ours ms | fla ms | fla/ours | ours % BW | fla % BW | ours vs ref | fla |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in gdn_rows:
        has_fla, has_bw = "fla" in r, "bw" in r
        lines.append(" | ".join([
            f"| {r['op']}", r["shape"], f"{r['ours']:.3f}", f"{r['fla']:.3f}" if has_fla else "n/a",
            f"{r['fla'] / r['ours']:.2f}x" if has_fla else "n/a",
            f"{r['bw'](r['ours']):.1f}" if has_bw else "—",
            f"{r['bw'](r['fla']):.1f}" if has_bw and has_fla else "—",
            r["err"], r.get("err_fla", "n/a")]) + " |")
    lines += ["", "| op | shape | ours ms | copy of its bytes ms | ours/copy | ours % BW | ours vs ref |",
              "|---|---|---|---|---|---|---|"]
    for r in conv_rows:
        lines.append(f"| {r['op']} | {r['shape']} | {r['ours']:.3f} | {r['copy']:.3f} | {r['ours'] / r['copy']:.2f}x "
                     f"| {r['bw'](r['ours']):.1f} | {r['err']} |")
    lines += ["", "Eager calls (do_bench median; host us: Python, checks and launch per call)", "",
              "| op | shape | ours GPU ms | ours do_bench ms | ours host us | fla GPU ms | fla do_bench ms "
              "| fla host us |", "|---|---|---|---|---|---|---|---|"]
    for r in gdn_rows + conv_rows:
        if "eager" not in r:
            continue
        e = r["eager"]
        fla = [f"{r['fla']:.3f}", f"{e['fla']:.3f}", f"{e['fla_host']:.0f}"] if "fla" in e else ["n/a"] * 3
        lines.append(" | ".join([f"| {r['op']}", r["shape"], f"{r['ours']:.3f}", f"{e['ours']:.3f}",
                                 f"{e['ours_host']:.0f}", *fla]) + " |")
    return "\n".join(lines)


def run(report: Callable[[str], None] = print, tune: bool = True, long: bool = True,
        profile: bool = True) -> list[dict]:
    """Benchmark every case; report(line) gets the environment, tuning and profile notes and the
    markdown tables."""
    assert torch.cuda.is_available(), "this benchmark needs a CUDA GPU"
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    fla_from = f"fla {getattr(fla, '__version__', '?')}" if fla is not None else f"fla n/a: {FLA_MISSING}"
    report(f"{props.name}, {props.multi_processor_count} SMs; torch {torch.__version__}, triton {triton.__version__}; "
           f"{fla_from}")
    copy_bw = copy_bandwidth()
    report(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s (read + write)")
    report(f"H_qk {HK}, H_v {HV}, K {K}, V {V}, {str(DTYPE).split('.')[-1]} inputs, fp32 state; "
           f"conv {CONV_DIM} channels, width {WIDTH}")
    gdn_rows, conv_rows = [], []
    for batch in DECODE_BATCHES:
        gdn_rows.append(decode_case(batch, copy_bw, tune, report))
    for num_seqs, seqlen in PREFILL_CASES:
        if num_seqs * seqlen > 4096 and not long:
            continue
        gdn_rows.append(prefill_case(num_seqs, seqlen, tune, profile, report))
        torch.cuda.empty_cache()
    for batch in DECODE_BATCHES:
        conv_rows.append(conv_decode_case(batch, copy_bw, tune, report))
    for num_seqs, seqlen in PREFILL_CASES:
        if num_seqs * seqlen > 4096 and not long:
            continue
        conv_rows.append(conv_prefill_case(num_seqs, seqlen, copy_bw, tune, report))
    report("")
    report(table(gdn_rows, conv_rows))
    return gdn_rows + conv_rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-tune", action="store_true", help="skip timing our kernels under other launch configs")
    ap.add_argument("--no-long", action="store_true", help="skip the 32768-token prefills")
    ap.add_argument("--no-profile", action="store_true", help="skip the per-kernel split of the prefills")
    args = ap.parse_args()
    run(print, tune=not args.no_tune, long=not args.no_long, profile=not args.no_profile)
