"""The FP8 weight-only GEMV (fp8_weight_only._gemv_kernel) at one and two rows (batch-1 and 2 decode) on the
Qwen3.5-9B shapes under every config of its tuner, and the gated MLP's gate_up with silu_and_mul in the GEMV's
epilogue against the two launches. Timed inside CUDA graphs against bf16 cuBLAS and the copy bandwidth.

Measured and dropped (2026-12-02h call1, this file at 4c8b4a7): e4m3 widened by integer operations instead of the
conversion instructions (int32 words of four values, each byte's bits shifted into a float32) was 1.3-1.6x slower
on every shape; loads straight to registers (STAGES=1) 1.2-1.9x slower.

    PYTHONPATH=. python bench/fp8_gemv_variants.py
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fp8_kernels import in_graph_ms, layer_weights  # noqa: E402
from moe_kernels import copy_bandwidth  # noqa: E402

from triton_kernels import fp8_weight_only as fwo  # noqa: E402
from triton_kernels.norms import silu_and_mul  # noqa: E402


def gemv_cvt(x, q, s, y, block_n, block_k, stages, warps) -> None:
    """The served GEMV kernel at one explicit config."""
    (m, k), n = x.shape, q.shape[0]
    fwo._gemv_kernel[(triton.cdiv(n, block_n),)](x, q, s, y, y, m, n, k, x.stride(0), q.stride(0), s.stride(0),
                                                y.stride(0), HAS_BIAS=False, GATED=False,
                                                ROWS=triton.next_power_of_2(m), BLOCK_N=block_n, BLOCK_K=block_k,
                                                STAGES=stages, num_warps=warps)


SERVED = [(c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.kwargs["STAGES"], c.num_warps) for c in fwo._gemv_tuned.configs]
CONFIGS = {"cvt": SERVED}
KERNELS = {"cvt": gemv_cvt}


def gated_ms(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor) -> tuple[float, float, bool]:
    """(the served GEMM then silu_and_mul, the gated GEMM: ms each inside CUDA graphs; whether they agree bit for
    bit) for a gated MLP's gate_up weight q [2I, K]."""
    def two():
        return silu_and_mul(gate_up=fwo.fp8_weight_only_gemm(x=x, weight=q, weight_scale_inv=s))

    def one():
        return fwo.fp8_weight_only_gated_gemm(x=x, weight=q, weight_scale_inv=s)

    return in_graph_ms(two), in_graph_ms(one), torch.equal(two(), one())


def main() -> None:
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s\n")
    print("| layer | M | widening | best config (BLOCK_N, BLOCK_K, STAGES, warps) | ms | % copy BW | served tuned ms | "
          "bf16 cuBLAS ms | rel err |")
    print("|---|---|---|---|---|---|---|---|---|")
    errors, gated = [], []
    for name, n, k, q, s, w16 in layer_weights():
        for m in (1, 2):
            x = torch.randn(m, k, device="cuda").bfloat16()
            y = torch.empty(m, n, dtype=x.dtype, device=x.device)
            ref = fwo.fp8_weight_only_gemm_ref(x=x, weight=q, weight_scale_inv=s).float()
            t16 = in_graph_ms(lambda: F.linear(x, w16))  # noqa: B023
            served = in_graph_ms(lambda: fwo._launch(x, q, s, None, y, "gemv"))  # noqa: B023
            moved = n * k + s.numel() * 4 + m * k * 2 + m * n * 2
            for widening, kernel in KERNELS.items():
                times = {}
                for cfg in CONFIGS[widening]:
                    try:
                        kernel(x, q, s, y, *cfg)
                        err = ((y.float() - ref).norm() / ref.norm()).item()
                        times[cfg] = (in_graph_ms(lambda cfg=cfg: kernel(x, q, s, y, *cfg)), err)  # noqa: B023
                    except Exception as exc:  # a config that does not compile (registers, shared memory)
                        errors.append(f"{widening} {cfg}: {type(exc).__name__}: {str(exc)[:120]}")
                cfg, (t, err) = min(times.items(), key=lambda kv: kv[1][0])
                print(f"| {name} | {m} | {widening} | {cfg} | {t:.4f} | {100 * moved / (t * 1e-3) / copy_bw:.0f} | "
                      f"{served:.4f} | {t16:.4f} | {err:.1e} |")
                print(f"<!-- {name} M{m} {widening}: " + "; ".join(f"{c}: {v[0]:.4f}" for c, v in times.items()) +
                      " -->")
            if name == "mlp gate_up":
                gated.append((m, gated_ms(x, q, s)))
    print("\n| gate_up + silu_and_mul, M | two launches ms | the activation in the GEMV's epilogue ms | bit-equal |")
    print("|---|---|---|---|")
    for m, (two, one, equal) in gated:
        print(f"| {m} | {two:.4f} | {one:.4f} | {equal} |")
    for line in errors:
        print("Error:", line)


if __name__ == "__main__":
    main()
