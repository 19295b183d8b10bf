"""Question: is our Mamba2 SSD chunked prefill at least as fast as mamba_ssm's mamba_chunk_scan_combined?

Mamba2 SSD prefill on one GPU: ours (`mamba2_prefill`) vs mamba_ssm's Triton
`mamba_chunk_scan_combined`, in the same run, at the Nemotron-H-8B mixer shape (H 128, P 64,
N 128, G 8, chunk 128), bf16 x / dt / B / C, fp32 A_log / D / dt_bias and fp32 states.

    PYTHONPATH=. python3 bench/ssd_bench.py [--sweep] [--profile]

Needs torch, triton and mamba_ssm's Triton modules (`load_mamba_triton` below finds an installed
mamba_ssm or unpacks `.whl/mamba_ssm-*.whl`; carry `.whl`).

What each side gets, as Nemotron-H's mixer uses the scan: D [H] (the skip), no z (its gated RMSNorm
applies silu(z) after the scan), dt_bias with softplus, dt_limit (0, inf). Ours reads x, B, C as
strided views of the conv output row [x | B | C] and dt as a view of the in_proj row, and writes
the final states in place into an fp32 pool through shuffled slot indices; B8 runs packed varlen
(8 sequences of 4096 tokens in one [32768, ...] batch, cu_seqlens). mamba_ssm gets contiguous
[batch, T, ...] inputs (B8: batch 8), A = -exp(A_log) precomputed, dt_softplus=True and
return_final_states=True (serving needs the final state; it returns them as a new tensor). Fresh
prefills: no initial state. A second table adds z gating and initial states (ours from the slots,
mamba_ssm from a contiguous batch) - the shape of a continued chunked prefill in the models that
gate in the scan. Times are `triton.testing.do_bench` medians (L2 flushed before each call); the
ratio is mamba_ssm / ours (> 1: ours is faster). "ours % BW" counts the bytes that must move
(inputs read, y and final states written) against the copy bandwidth measured in the same run.
Every case checks ours against mamba_ssm (relative L2 error of y and of the final states).
--sweep times other launch configs of our kernels; --profile splits each side into its kernels.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import importlib.util
import os
import sys
import types
import zipfile
from collections.abc import Callable

import torch
import triton
import triton.testing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.gdn_kernels import kernel_times  # noqa: E402
from triton_kernels.ssd_chunk import SSDLaunch, _mamba2_prefill_fwd, default_launch, tile_tokens  # noqa: E402

H, G, P, N, CHUNK = 128, 8, 64, 128, 128  # Nemotron-H-8B mamba2 mixer
CASES = [(1, 4096), (1, 32768), (8, 4096)]  # (sequences, tokens each)
DTYPE = torch.bfloat16
DEVICE = "cuda"


# ---- the anchor: mamba_ssm's Triton modules, without its CUDA extensions ---------------------------
# `MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE pip wheel mamba-ssm==2.3.2.post1 --no-deps
# --no-build-isolation -w .whl` builds a pure-Python wheel. Its package `__init__` imports compiled
# modules (selective_scan_cuda, causal_conv1d), so `load_mamba_triton` puts empty stand-ins for the
# packages `mamba_ssm`, `mamba_ssm.ops` and `mamba_ssm.ops.triton` (with the real folders as their
# paths) into sys.modules and imports only the Triton module files asked for. These need torch,
# triton, einops and packaging.
#
# Where the package comes from: an installed mamba_ssm if Python finds one (found, not imported), else
# the newest `.whl/mamba_ssm-*.whl`, unpacked once into `.whl/unpacked/` (no pip needed). A missing
# einops or packaging is taken the same way from `.whl/einops-*.whl` / `.whl/packaging-*.whl`.
WHEELS = os.path.join(ROOT, ".whl")


def _unpacked(wheel: str) -> str:
    """The folder holding the wheel's files (unpacked on first use)."""
    target = os.path.join(WHEELS, "unpacked", os.path.basename(wheel)[: -len(".whl")])
    if not os.path.isdir(target):
        partial = f"{target}.partial{os.getpid()}"
        with zipfile.ZipFile(wheel) as z:
            z.extractall(partial)
        os.replace(partial, target)
    return target


def _find_or_unpack(name: str, wheel_prefix: str) -> str | None:
    """Makes `name` importable (from a wheel in .whl/ if Python does not find it); returns the
    folder of the package, or None when there is neither."""
    spec = importlib.util.find_spec(name)  # a top-level package is found without being imported
    if spec is None:
        wheels = sorted(glob.glob(os.path.join(WHEELS, f"{wheel_prefix}-*.whl")))
        if not wheels:
            return None
        sys.path.insert(0, _unpacked(wheels[-1]))
        importlib.invalidate_caches()
        spec = importlib.util.find_spec(name)
    return None if spec is None or spec.submodule_search_locations is None else spec.submodule_search_locations[0]


def load_mamba_triton(module: str) -> types.ModuleType:
    """mamba_ssm.ops.triton.<module>, imported without running mamba_ssm's package __init__ files."""
    for dep in ("einops", "packaging"):
        if _find_or_unpack(dep, dep) is None:
            raise ImportError(f"mamba_ssm's Triton modules need {dep}: pip install {dep}, or put its wheel in .whl/")
    if "mamba_ssm" not in sys.modules:
        root = _find_or_unpack("mamba_ssm", "mamba_ssm")
        if root is None:
            raise ImportError("mamba_ssm not found: install it, or build its pure-Python wheel into .whl/ "
                              "(see bench/ssd_bench.py)")
        for name, path in (("mamba_ssm", root), ("mamba_ssm.ops", os.path.join(root, "ops")),
                           ("mamba_ssm.ops.triton", os.path.join(root, "ops", "triton"))):
            package = types.ModuleType(name)
            package.__path__ = [path]
            sys.modules[name] = package
    return importlib.import_module(f"mamba_ssm.ops.triton.{module}")


def bench_ms(fn: Callable) -> float:
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def copy_bandwidth() -> float:
    """Device copy bandwidth in bytes/s, counting read + write."""
    x = torch.empty(1 << 30, dtype=torch.uint8, device=DEVICE)
    y = torch.empty_like(x)
    return 2 * x.numel() / (bench_ms(lambda: y.copy_(x)) * 1e-3)


def model_inputs(num_seqs: int, seqlen: int, seed: int = 0) -> dict:
    """x, B, C as views of one conv output [T, H*P + 2*G*N]; z, dt as views of one in_proj output
    [T, H*P + conv_dim + H]; A = -(1..16), dt_bias the inverse softplus of 1e-3..1e-1 (mamba_ssm's
    initialization)."""
    T = num_seqs * seqlen
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    conv_dim = H * P + 2 * G * N
    xbc = torch.randn(T, conv_dim, generator=g, device=DEVICE, dtype=DTYPE)
    proj = torch.randn(T, H * P + conv_dim + H, generator=g, device=DEVICE, dtype=DTYPE)
    x, B, C = xbc.split([H * P, G * N, G * N], dim=-1)
    z, _, dt = proj.split([H * P, conv_dim, H], dim=-1)
    dt0 = torch.exp(torch.empty(H, device=DEVICE).uniform_(-6.9, -2.3, generator=g))
    return dict(x=x.view(T, H, P), dt=dt, B=B.view(T, G, N), C=C.view(T, G, N), z=z.view(T, H, P),
                A_log=torch.log(torch.empty(H, device=DEVICE).uniform_(1, 16, generator=g)),
                D=torch.randn(H, generator=g, device=DEVICE), dt_bias=dt0 + torch.log(-torch.expm1(-dt0)))


class Case:
    """One benchmark shape: our inputs, pool and batch; mamba_ssm's contiguous batch."""

    def __init__(self, num_seqs: int, seqlen: int, *, gated: bool, initial: bool):
        self.name = f"B{num_seqs}·T{seqlen}"
        self.num_seqs, self.seqlen, self.T = num_seqs, seqlen, num_seqs * seqlen
        self.inputs = model_inputs(num_seqs, seqlen)
        if not gated:
            self.inputs["z"] = None
        g = torch.Generator(device=DEVICE).manual_seed(1)
        self.pool = 0.1 * torch.randn(num_seqs + 4, H, P, N, generator=g, device=DEVICE)
        self.slots = torch.randperm(num_seqs + 4, generator=g, device=DEVICE)[:num_seqs].to(torch.int32)
        self.cu_seqlens = torch.arange(num_seqs + 1, device=DEVICE, dtype=torch.int32) * seqlen
        self.has_initial_state = torch.full((num_seqs,), initial, device=DEVICE)
        self.pool_before = self.pool.clone()

        def batched(t):  # [T, ...] -> contiguous [num_seqs, seqlen, ...]
            return None if t is None else t.reshape(num_seqs, seqlen, *t.shape[1:]).contiguous()

        a = self.inputs
        self.anchor_args = [batched(a["x"]), batched(a["dt"]), -torch.exp(a["A_log"]), batched(a["B"]),
                            batched(a["C"]), CHUNK]
        self.anchor_kwargs = dict(D=a["D"], z=batched(a["z"]), dt_bias=a["dt_bias"], dt_softplus=True,
                                  initial_states=self.pool[self.slots.long()].contiguous() if initial else None,
                                  return_final_states=True)

    def ours(self, launch: SSDLaunch | None = None) -> torch.Tensor:
        return _mamba2_prefill_fwd(**self.inputs, ssm_states=self.pool, cu_seqlens=self.cu_seqlens,
                                   state_slots=self.slots, has_initial_state=self.has_initial_state,
                                   chunk_size=CHUNK, dt_limit=(0.0, float("inf")), launch=launch)

    def anchor(self, scan: Callable):
        with torch.no_grad():
            return scan(*self.anchor_args, **self.anchor_kwargs)

    def bytes_moved(self) -> int:
        """Inputs read once, y and the final states written (and read when continuing)."""
        T, n = self.T, self.num_seqs
        per_token = (2 * H * P + 2 * G * N + H) * 2 + (H * P * 2 if self.inputs["z"] is not None else 0)
        states = n * H * P * N * 4 * (2 if bool(self.has_initial_state[0]) else 1)
        return T * per_token + states

    def default_launch(self) -> SSDLaunch:
        return default_launch(self.T, self.num_seqs, H, G, P, N, tile_tokens(CHUNK, N), torch.device(DEVICE))


def check(case: Case, scan: Callable) -> tuple[float, float]:
    """Relative errors of our y and final states against mamba_ssm's (ours run on a fresh pool)."""
    case.pool.copy_(case.pool_before)
    y = case.ours()
    y_anchor, final_anchor = case.anchor(scan)
    return rel_err(y, y_anchor.reshape(y.shape)), rel_err(case.pool[case.slots.long()], final_anchor)


def sweep_configs(base: SSDLaunch) -> list[SSDLaunch]:
    """Around the default: the state kernel's (P block, warps, stages) with the output kernel as
    chosen, then the output kernel's (heads per program, warps, stages) with the state kernel as chosen."""
    state = [(32, 4, 1), (32, 4, 2), (32, 4, 3), (64, 4, 1), (64, 4, 2), (64, 4, 3), (64, 8, 2)]
    output = [(heads, w, s) for heads in (2, 4, 8, 16) for w, s in ((8, 1), (8, 2), (8, 3), (4, 2))]
    configs = [SSDLaunch(p, w, s, base.heads_per_program, base.output_warps, base.output_stages) for p, w, s in state]
    configs += [SSDLaunch(base.state_block_p, base.state_warps, base.state_stages, h, w, s) for h, w, s in output]
    return [c for c in configs if c != base]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true", help="time other launch configs of our kernels")
    parser.add_argument("--profile", action="store_true", help="per-kernel times of both sides")
    args = parser.parse_args()
    scan = load_mamba_triton("ssd_combined").mamba_chunk_scan_combined
    bw = copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; "
          f"copy bandwidth {bw / 1e12:.2f} TB/s\n")

    for title, gated, initial in (("D, no z, fresh prefill (Nemotron-H)", False, False),
                                  ("D and z, initial states (continued chunked prefill)", True, True)):
        print(f"### {title}\n")
        print("| case | ours ms | mamba_ssm ms | mamba_ssm / ours | ours % BW | y rel err | state rel err "
              "| ours launch |")
        print("|---|---|---|---|---|---|---|---|")
        for num_seqs, seqlen in CASES:
            case = Case(num_seqs, seqlen, gated=gated, initial=initial)
            err_y, err_s = check(case, scan)
            ours_ms = bench_ms(case.ours)
            anchor_ms = bench_ms(lambda case=case: case.anchor(scan))
            pct = case.bytes_moved() / (ours_ms * 1e-3) / bw * 100
            launch = case.default_launch()
            print(f"| {case.name} | {ours_ms:.3f} | {anchor_ms:.3f} | {anchor_ms / ours_ms:.2f}x | {pct:.0f} | "
                  f"{err_y:.1e} | {err_s:.1e} | {launch} |")
            if args.profile:
                for side, fn in (("ours", case.ours), ("mamba_ssm", lambda case=case: case.anchor(scan))):
                    parts = ", ".join(f"{k[:60]} {v:.3f}" for k, v in kernel_times(fn, iters=10))
                    print(f"|  | {side} by kernel (ms): {parts} |||||||")
            if args.sweep and not gated:
                base = case.default_launch()
                y_base = case.ours().clone()
                results = []
                for cfg in sweep_configs(base):
                    try:
                        y = case.ours(cfg)
                        results.append((bench_ms(lambda cfg=cfg, case=case: case.ours(cfg)), cfg, rel_err(y, y_base)))
                    except Exception as e:  # out of registers or shared memory
                        print(f"|  | sweep: {cfg} failed: {type(e).__name__} |||||||")
                for ms, cfg, err in sorted(results, key=lambda r: r[0])[:8]:
                    print(f"|  | sweep {ms:.3f} ms (vs y {err:.0e}) | | | | | | {cfg} |")
            del case
            torch.cuda.empty_cache()
        print()


if __name__ == "__main__":
    main()
