"""RMS norms used by the hybrid families, and the fused SiLU-gated product of gated MLPs.

rmsnorm:        y = x / rms(x) * (w + offset)      offset 1.0 for zero-centered weights (Qwen3-Next / 3.5)
add_rmsnorm:    r = x + residual (rounded to the dtype, as in eager); y = rmsnorm(r); returns (y, r);
                with `branch`, r = (x + branch) + residual (Falcon-H1's two parallel branches)
gated_rmsnorm:  y = (x / rms(x)) * w * silu(z)       (norm before gate; GDN output norm)
gate_rmsnorm:   y = norm_groups(x * silu(z)) * w      (gate before norm, by channel groups; Mamba2 output norm)
silu_and_mul:   y = silu(a) * b for gate_up = [a | b]
relu2:          y = relu(x)^2 (Nemotron-H's MLP), one kernel where eager runs two
Math in float32; each rounding to the model dtype happens where the eager code rounds, so
bf16 results match the references bit for bit in the common cases.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from triton_kernels.cached_launch import cached_launch
from triton_kernels.host_math import cdiv, next_power_of_2


def rmsnorm_ref(*, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    """x: [T, N]; weight: [N]. Math in float32, result in x's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * (weight.float() + offset)).to(x.dtype)


def add_rmsnorm_ref(*, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                    offset: float = 0.0, branch: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual (, branch): [T, N]. Returns (rmsnorm(r), r) for r = x + residual, or (x + branch) + residual."""
    r = (x if branch is None else x + branch) + residual
    return rmsnorm_ref(x=r, weight=weight, eps=eps, offset=offset), r


def gated_rmsnorm_ref(*, x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x, z: [T, N] or [T, H, N]; weight: [N]. Normalize x over N, scale by weight, gate by silu(z)."""
    xf = x.float()
    y = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * y * F.silu(z.float())).to(x.dtype)


def gate_rmsnorm_ref(*, x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                     group_size: int) -> torch.Tensor:
    """Mamba2 output norm (gate first): x, z: [T, D]; weight: [D]. y = x * silu(z), normalized over
    each group of `group_size` channels (group_size = D: the whole row), scaled by weight."""
    t, d = x.shape
    g = (x.float() * F.silu(z.float())).view(t, d // group_size, group_size)
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    return (weight * g.view(t, d).to(x.dtype)).to(x.dtype)


def silu_and_mul_ref(*, gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2I] -> silu(gate) * up: [T, I]."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def relu2_ref(*, x: torch.Tensor) -> torch.Tensor:
    """x: [T, I] -> relu(x)^2: [T, I]."""
    return F.relu(x).square()


# ---------------------------------------------------------------------------------------------
# The math of each norm over the last axis of a float32 tile (0 past N), shared by the norm kernels here
# and the kernels that fuse a norm (moe_routing.py's router, gdn_recurrent.py's decode step).

@triton.jit
def rmsnorm_tile(b_x, b_w, N, eps, offset):
    """b_x [..., BLOCK_N] float32; b_w [BLOCK_N] -> b_x / rms(b_x) * (b_w + offset) in float32."""
    b_rstd = tl.rsqrt(tl.sum(b_x * b_x, -1, keep_dims=True) / N + eps)
    return b_x * b_rstd * (b_w.to(tl.float32) + offset)


@triton.jit
def gated_rmsnorm_tile(b_x, b_z, b_w, N, eps, dtype: tl.constexpr):
    """b_x, b_z [..., BLOCK_N] float32; b_w [BLOCK_N] in the model dtype -> the gated norm in float32:
    b_x normalized and rounded to dtype (as eager rounds it first), times b_w, gated by silu(b_z)."""
    b_rstd = tl.rsqrt(tl.sum(b_x * b_x, -1, keep_dims=True) / N + eps)
    b_n = (b_x * b_rstd).to(dtype)
    return (b_w * b_n).to(tl.float32) * (b_z * tl.sigmoid(b_z))


@cached_launch
@triton.jit
def _rmsnorm_kernel(x, res, br, w, y, r_out, stride_x, stride_res, stride_br, stride_y, stride_r, n_rows, N, eps,
                    offset, HAS_RES: tl.constexpr, HAS_BRANCH: tl.constexpr, BLOCK_R: tl.constexpr,
                    BLOCK_N: tl.constexpr):
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    o_n = tl.arange(0, BLOCK_N)
    m = (o_r < n_rows)[:, None] & (o_n < N)[None, :]
    o_r = o_r.to(tl.int64)
    b_x = tl.load(x + o_r[:, None] * stride_x + o_n[None, :], mask=m, other=0.0)
    if HAS_BRANCH:  # rounded to the dtype before the residual joins, as eager's two adds
        b_x = b_x + tl.load(br + o_r[:, None] * stride_br + o_n[None, :], mask=m, other=0.0)
    if HAS_RES:
        b_x = b_x + tl.load(res + o_r[:, None] * stride_res + o_n[None, :], mask=m, other=0.0)
        tl.store(r_out + o_r[:, None] * stride_r + o_n[None, :], b_x, mask=m)
    b_y = rmsnorm_tile(b_x.to(tl.float32), tl.load(w + o_n, mask=o_n < N, other=0.0), N, eps, offset)
    tl.store(y + o_r[:, None] * stride_y + o_n[None, :], b_y.to(y.dtype.element_ty), mask=m)


@cached_launch
@triton.jit
def _gated_rmsnorm_kernel(x, z, w, y, stride_xt, stride_xh, stride_zt, stride_zh, stride_y, n_rows, H, N, eps,
                          BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr):
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # row r = token * H + head
    o_n = tl.arange(0, BLOCK_N)
    m = (o_r < n_rows)[:, None] & (o_n < N)[None, :]
    o_r = o_r.to(tl.int64)
    o_x = (o_r // H) * stride_xt + (o_r % H) * stride_xh
    o_z = (o_r // H) * stride_zt + (o_r % H) * stride_zh
    b_x = tl.load(x + o_x[:, None] + o_n[None, :], mask=m, other=0.0).to(tl.float32)
    b_z = tl.load(z + o_z[:, None] + o_n[None, :], mask=m, other=0.0).to(tl.float32)
    b_y = gated_rmsnorm_tile(b_x, b_z, tl.load(w + o_n, mask=o_n < N, other=0.0), N, eps, y.dtype.element_ty)
    tl.store(y + o_r[:, None] * stride_y + o_n[None, :], b_y.to(y.dtype.element_ty), mask=m)


@cached_launch
@triton.jit
def _gate_rmsnorm_kernel(x, z, w, y, stride_x, stride_z, stride_y, n_rows, group_size, eps,
                         BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr):
    """One program per (block of rows, channel group)."""
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    o_g = tl.arange(0, BLOCK_G)
    m_g = o_g < group_size
    m = (o_r < n_rows)[:, None] & m_g[None, :]
    o_r = o_r.to(tl.int64)
    o_c = tl.program_id(1) * group_size + o_g  # channels of this group
    b_x = tl.load(x + o_r[:, None] * stride_x + o_c[None, :], mask=m, other=0.0).to(tl.float32)
    b_z = tl.load(z + o_r[:, None] * stride_z + o_c[None, :], mask=m, other=0.0).to(tl.float32)
    b_g = b_x * (b_z * tl.sigmoid(b_z))
    b_rstd = tl.rsqrt(tl.sum(b_g * b_g, 1) / group_size + eps)
    b_n = (b_g * b_rstd[:, None]).to(y.dtype.element_ty)  # eager rounds the normalized value first
    b_w = tl.load(w + o_c, mask=m_g, other=0.0).to(tl.float32)
    tl.store(y + o_r[:, None] * stride_y + o_c[None, :], (b_w[None, :] * b_n.to(tl.float32)).to(y.dtype.element_ty),
             mask=m)


@cached_launch
@triton.jit
def _silu_and_mul_kernel(gu, y, stride_gu, stride_y, n_rows, I, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    o_i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    m = (o_r < n_rows)[:, None] & (o_i < I)[None, :]
    o_r = o_r.to(tl.int64)
    b_g = tl.load(gu + o_r[:, None] * stride_gu + o_i[None, :], mask=m, other=0.0).to(tl.float32)
    b_u = tl.load(gu + o_r[:, None] * stride_gu + I + o_i[None, :], mask=m, other=0.0)
    b_s = (b_g * tl.sigmoid(b_g)).to(b_u.dtype)  # silu in the model dtype, as F.silu returns it
    tl.store(y + o_r[:, None] * stride_y + o_i[None, :], b_s * b_u, mask=m)


@cached_launch
@triton.jit
def _relu2_kernel(x, y, stride_x, stride_y, n_rows, I, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr):
    o_r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    o_i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    m = (o_r < n_rows)[:, None] & (o_i < I)[None, :]
    o_r = o_r.to(tl.int64)
    b_x = tl.maximum(tl.load(x + o_r[:, None] * stride_x + o_i[None, :], mask=m, other=0.0).to(tl.float32), 0.0)
    tl.store(y + o_r[:, None] * stride_y + o_i[None, :], (b_x * b_x).to(y.dtype.element_ty), mask=m)


def _rows_per_program(n: int) -> tuple[int, int]:
    block_n = next_power_of_2(n)
    return max(1, min(64, 4096 // block_n)), block_n


def _elementwise_tiles(width: int) -> tuple[int, int]:
    """(rows, columns) of an elementwise program's tile: up to 1024 columns, 2048 elements."""
    block_i = min(1024, next_power_of_2(width))
    return max(1, 2048 // block_i), block_i


def _rows(t: torch.Tensor) -> torch.Tensor:
    assert t.dim() == 2 and t.stride(-1) == 1, f"expected [T, N] with unit last stride, got {tuple(t.shape)}"
    return t


def rmsnorm(*, x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    x = _rows(x)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    block_r, block_n = _rows_per_program(x.shape[1])
    _rmsnorm_kernel[(cdiv(x.shape[0], block_r),)](
        x, x, x, weight, y, y, x.stride(0), 0, 0, y.stride(0), 0, x.shape[0], x.shape[1], eps, offset,
        HAS_RES=False, HAS_BRANCH=False, BLOCK_R=block_r, BLOCK_N=block_n)
    return y


def add_rmsnorm(*, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                offset: float = 0.0, branch: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    x, residual = _rows(x), _rows(residual)
    assert x.shape == residual.shape and x.dtype == residual.dtype
    br = x if branch is None else _rows(branch)
    assert br.shape == x.shape and br.dtype == x.dtype
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    r = torch.empty_like(y)
    block_r, block_n = _rows_per_program(x.shape[1])
    _rmsnorm_kernel[(cdiv(x.shape[0], block_r),)](
        x, residual, br, weight, y, r, x.stride(0), residual.stride(0), br.stride(0), y.stride(0), r.stride(0),
        x.shape[0], x.shape[1], eps, offset, HAS_RES=True, HAS_BRANCH=branch is not None, BLOCK_R=block_r,
        BLOCK_N=block_n)
    return y, r


def gated_rmsnorm(*, x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x, z: [T, N] or [T, H, N] (any leading strides, unit last stride); the norm runs over N.
    Returns the same shape, contiguous."""
    assert x.shape == z.shape and x.stride(-1) == 1 and z.stride(-1) == 1
    x3, z3 = (x, z) if x.dim() == 3 else (x.unsqueeze(1), z.unsqueeze(1))
    t, h, n = x3.shape
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block_r, block_n = _rows_per_program(n)
    _gated_rmsnorm_kernel[(cdiv(t * h, block_r),)](
        x3, z3, weight, y, x3.stride(0), x3.stride(1), z3.stride(0), z3.stride(1), n, t * h, h, n, eps,
        BLOCK_R=block_r, BLOCK_N=block_n)
    return y


def gate_rmsnorm(*, x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float,
                 group_size: int) -> torch.Tensor:
    """Triton version of gate_rmsnorm_ref: x, z: [T, D] (any row strides, unit last stride);
    weight: [D]; D a multiple of group_size. Returns y: [T, D] contiguous, in x's dtype."""
    x, z = _rows(x), _rows(z)
    t, d = x.shape
    assert z.shape == x.shape and weight.shape == (d,), (x.shape, z.shape, weight.shape)
    assert d % group_size == 0, f"D={d} is not a multiple of group_size={group_size}"
    y = torch.empty((t, d), dtype=x.dtype, device=x.device)
    block_r, block_g, warps = _gate_rmsnorm_config(group_size)
    _gate_rmsnorm_kernel[(cdiv(t, block_r), d // group_size)](
        x, z, weight, y, x.stride(0), z.stride(0), y.stride(0), t, group_size, eps,
        BLOCK_R=block_r, BLOCK_G=block_g, num_warps=warps)
    return y


def _gate_rmsnorm_config(group_size: int) -> tuple[int, int, int]:
    """(rows per program, group block, warps): 8 warps once a program holds more than 2048 channels."""
    block_r, block_g = _rows_per_program(group_size)
    return block_r, block_g, 8 if block_r * block_g > 2048 else 4


def silu_and_mul(*, gate_up: torch.Tensor) -> torch.Tensor:
    gate_up = _rows(gate_up)
    n, i = gate_up.shape[0], gate_up.shape[1] // 2
    y = torch.empty((n, i), dtype=gate_up.dtype, device=gate_up.device)
    block_r, block_i = _elementwise_tiles(i)
    _silu_and_mul_kernel[(cdiv(n, block_r), cdiv(i, block_i))](
        gate_up, y, gate_up.stride(0), y.stride(0), n, i, BLOCK_R=block_r, BLOCK_I=block_i)
    return y


def relu2(*, x: torch.Tensor) -> torch.Tensor:
    x = _rows(x)
    n, i = x.shape
    y = torch.empty((n, i), dtype=x.dtype, device=x.device)
    block_r, block_i = _elementwise_tiles(i)
    _relu2_kernel[(cdiv(n, block_r), cdiv(i, block_i))](
        x, y, x.stride(0), y.stride(0), n, i, BLOCK_R=block_r, BLOCK_I=block_i)
    return y
