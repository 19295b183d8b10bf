"""Skinny matmul for decode batches: out[M, N] = x[M, K] @ weight[N, K]^T with M small (≤ 64).

At decode sizes a linear layer is a stream of its weight: every byte is read once and used M
times, so time is bytes / bandwidth. Each program owns BLOCK_N output features and walks the whole
of K, so no split-K partials or reduction kernel are needed; BLOCK_N is picked so that at least two
programs per SM are in flight. The M rows are padded to a tensor-core tile (≥ 16).

The MLP's activation can be applied to the input as it is read, so its kernel and its [M, K]
round trip disappear: act="silu_mul" takes x = [gate | up] of shape [M, 2K] and reads
silu(gate) * up (rounded to the model dtype as `silu_and_mul` rounds it); act="relu2" reads
relu(x)^2 (Nemotron-H's MLP).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

MAX_M = 64


ACTS = {"none": 0, "silu_mul": 1, "relu2": 2}


def skinny_matmul_ref(*, x: torch.Tensor, weight: torch.Tensor, act: str = "none") -> torch.Tensor:
    """x: [M, K] (or [M, 2K] with act="silu_mul"); weight: [N, K] -> act(x) @ weight^T: [M, N]."""
    if act == "silu_mul":
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    elif act == "relu2":
        x = torch.relu(x).square()
    return F.linear(x, weight)


@triton.jit
def _skinny_matmul_kernel(x, w, out, M, N, K, stride_x, stride_w, stride_out,
                          ACT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr):
    o_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    o_m = tl.arange(0, BLOCK_M)
    m_n = o_n < N
    m_m = o_m < M
    w_rows = w + o_n.to(tl.int64)[None, :] * stride_w  # [1, BLOCK_N]: column n of w^T is row n of w
    x_rows = x + o_m.to(tl.int64)[:, None] * stride_x  # [BLOCK_M, 1]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        o_k = k0 + tl.arange(0, BLOCK_K)
        m_k = o_k < K
        b_w = tl.load(w_rows + o_k[:, None], mask=m_k[:, None] & m_n[None, :], other=0.0)  # [BLOCK_K, BLOCK_N]
        m_x = m_m[:, None] & m_k[None, :]
        b_x = tl.load(x_rows + o_k[None, :], mask=m_x, other=0.0)
        if ACT == 1:  # silu(gate) * up, silu rounded to the model dtype as F.silu returns it
            b_u = tl.load(x_rows + K + o_k[None, :], mask=m_x, other=0.0)
            b_g = b_x.to(tl.float32)
            b_x = (b_g * tl.sigmoid(b_g)).to(b_u.dtype) * b_u
        elif ACT == 2:  # relu(x)^2, squared in float32 and rounded once, as torch's square
            b_r = tl.maximum(b_x.to(tl.float32), 0.0)
            b_x = (b_r * b_r).to(x.dtype.element_ty)
        acc = tl.dot(b_x.to(b_w.dtype), b_w, acc)
    tl.store(out + o_m.to(tl.int64)[:, None] * stride_out + o_n[None, :], acc.to(out.dtype.element_ty),
             mask=m_m[:, None] & m_n[None, :])


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8


def default_blocks(n: int, m: int, device: torch.device) -> dict:
    """BLOCK_N: the largest of 64 / 32 / 16 that still gives ≥ 2 programs per SM."""
    block_n = 64
    while block_n > 16 and triton.cdiv(n, block_n) < 2 * _sm_count(device):
        block_n //= 2
    return {"BLOCK_N": block_n, "BLOCK_K": 256 if m <= 16 else 128, "num_warps": 8, "num_stages": 4}


def skinny_matmul(*, x: torch.Tensor, weight: torch.Tensor, act: str = "none",
                  blocks: dict | None = None) -> torch.Tensor:
    """x: [M, K] (or [M, 2K] with act="silu_mul"), unit last stride; weight: [N, K] contiguous;
    M ≤ MAX_M. blocks: BLOCK_N, BLOCK_K, num_warps, num_stages (default_blocks when None)."""
    m, n = x.shape[0], weight.shape[0]
    k = weight.shape[1]
    assert m <= MAX_M and x.stride(-1) == 1 and weight.is_contiguous(), "skinny_matmul: M ≤ 64, unit strides"
    assert x.shape[1] == (2 * k if act == "silu_mul" else k), \
        f"x {tuple(x.shape)} does not match weight {tuple(weight.shape)}"
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    cfg = dict(blocks or default_blocks(n, m, x.device))
    block_n = cfg.pop("BLOCK_N")
    _skinny_matmul_kernel[(triton.cdiv(n, block_n),)](
        x, weight, out, m, n, k, x.stride(0), weight.stride(0), out.stride(0),
        ACT=ACTS[act], BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=block_n, **cfg)
    return out
