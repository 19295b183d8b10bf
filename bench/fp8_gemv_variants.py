"""The FP8 weight-only GEMV at one row (batch-1 decode) on the Qwen3.5-9B shapes: which launch configs and which
way of widening e4m3 stream the weight fastest. Timed inside CUDA graphs against bf16 cuBLAS and the copy bandwidth.

- "cvt": the served kernel (fp8_weight_only._gemv_kernel): e4m3 -> fp16 pairs -> float32 conversions, every
  config of its tuner and the same configs with STAGES=1 (no shared-memory pipeline: loads straight to registers).
- "bits": `_gemv_bits_kernel` below, e4m3 widened by integer operations: the weight is read as int32 words of four
  values and each byte's sign and exponent-mantissa bits are shifted into place in a float32 (the value times
  2**-120, exact, e4m3 subnormals included); the scale takes the power of two back. No conversion instructions.

    PYTHONPATH=. python bench/fp8_gemv_variants.py
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from fp8_kernels import in_graph_ms, layer_weights  # noqa: E402
from moe_kernels import copy_bandwidth  # noqa: E402

from triton_kernels import fp8_weight_only as fwo  # noqa: E402

X_UP = tl.constexpr(2.0**64)  # x * scale * X_UP times (e4m3 * 2**-120) = the product * 2**-56; Y_UP takes 2**-56 back
Y_UP = tl.constexpr(2.0**56)


@triton.jit
def _gemv_bits_kernel(x, w32, s, y, M, N, K, stride_xm, stride_wn, stride_sn, stride_ym, ROWS: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr):
    """y[:M, o_n] = x @ dequant(w)^T for BLOCK_N columns. w32: the e4m3 weight [N, K] read as int32 [N, K // 4]
    (K % 4 == 0; stride_wn in words). Word j of a row holds the values of columns 4j..4j+3, byte c at bits 8c; the
    float32 with its sign bit and its 7 exponent-mantissa bits at bits 20-26 is that value times 2**-120."""
    tl.static_assert(128 % BLOCK_N == 0)
    W: tl.constexpr = BLOCK_K // 4
    G: tl.constexpr = BLOCK_K // 128
    i_n = tl.program_id(0)
    o_n = i_n * BLOCK_N + tl.arange(0, BLOCK_N)
    o_m = tl.arange(0, ROWS)
    o_j = tl.arange(0, W)
    o_g = tl.arange(0, G)
    m_n, m_m = o_n < N, o_m < M
    p_w = w32 + o_n.to(tl.int64)[:, None] * stride_wn + o_j[None, :]  # [BLOCK_N, W]
    p_x = x + o_m.to(tl.int64)[:, None] * stride_xm + 4 * o_j[None, :]  # [ROWS, W]: byte 0 of each word
    p_s = s + (i_n * BLOCK_N // 128) * stride_sn + o_g
    acc = tl.zeros((ROWS, BLOCK_N, W), dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        m_j = k0 + 4 * o_j < K
        b_w = tl.load(p_w + k0 // 4, mask=m_n[:, None] & m_j[None, :], other=0).to(tl.uint32, bitcast=True)
        b_s = tl.load(p_s + k0 // 128, mask=k0 + o_g * 128 < K, other=0.0) * X_UP
        for c in tl.static_range(4):
            b_x = tl.load(p_x + k0 + c, mask=m_m[:, None] & m_j[None, :], other=0.0).to(tl.float32)
            b_x = tl.reshape(tl.reshape(b_x, (ROWS, G, 32)) * b_s[None, :, None], (ROWS, W))
            if c == 3:
                bits = (b_w & 0x80000000) | ((b_w >> 4) & 0x07F00000)
            else:
                bits = ((b_w << (24 - 8 * c)) & 0x80000000) | ((b_w << (20 - 8 * c)) & 0x07F00000)
            acc += bits.to(tl.float32, bitcast=True)[None, :, :] * b_x[:, None, :]
    y_rows = tl.sum(acc, 2) * Y_UP
    p_y = y + o_m.to(tl.int64)[:, None] * stride_ym + o_n[None, :]
    tl.store(p_y, y_rows.to(y.dtype.element_ty), mask=m_m[:, None] & m_n[None, :])


def gemv_bits(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor, y: torch.Tensor, block_n: int, block_k: int,
              stages: int, warps: int) -> None:
    """x [M, K] (M <= 2), q [N, K] e4m3 (K % 4 == 0), s its block scales -> y [M, N]."""
    (m, k), n = x.shape, q.shape[0]
    w32 = q.view(torch.int32)
    _gemv_bits_kernel[(triton.cdiv(n, block_n),)](x, w32, s, y, m, n, k, x.stride(0), w32.stride(0), s.stride(0),
                                                  y.stride(0), ROWS=triton.next_power_of_2(m), BLOCK_N=block_n,
                                                  BLOCK_K=block_k, STAGES=stages, num_warps=warps)


def gemv_cvt(x, q, s, y, block_n, block_k, stages, warps) -> None:
    """The served GEMV kernel at one explicit config."""
    (m, k), n = x.shape, q.shape[0]
    fwo._gemv_kernel[(triton.cdiv(n, block_n),)](x, q, s, y, y, m, n, k, x.stride(0), q.stride(0), s.stride(0),
                                                y.stride(0), HAS_BIAS=False, ROWS=triton.next_power_of_2(m),
                                                BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages, num_warps=warps)


SERVED = [(c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.kwargs["STAGES"], c.num_warps) for c in fwo._gemv_tuned.configs]
CONFIGS = {
    "cvt": SERVED + sorted({(bn, bk, 1, w) for bn, bk, _, w in SERVED}),
    "bits": [(bn, bk, st, w) for bn, bk in [(8, 512), (16, 256), (16, 512), (32, 256)]
             for st, w in [(1, 4), (2, 4), (3, 4)]],
}
KERNELS = {"cvt": gemv_cvt, "bits": gemv_bits}


def main() -> None:
    copy_bw = copy_bandwidth()
    print(f"copy bandwidth {copy_bw / 1e12:.2f} TB/s\n")
    print("| layer | M | widening | best config (BLOCK_N, BLOCK_K, STAGES, warps) | ms | % copy BW | served tuned ms | "
          "bf16 cuBLAS ms | rel err |")
    print("|---|---|---|---|---|---|---|---|---|")
    errors = []
    for name, n, k, q, s, w16 in layer_weights():
        for m in (1,):
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
    for line in errors:
        print("Error:", line)


if __name__ == "__main__":
    main()
