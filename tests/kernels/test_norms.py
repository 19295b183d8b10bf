"""Fused norm / activation kernels vs their torch references (interpreter on CPU, float32;
bf16 on GPU where the roundings must match eager's)."""

import pytest
import torch

from triton_kernels import norms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(rows, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(rows, n, generator=g).to(DEVICE, dtype) for _ in range(3)]


@pytest.mark.parametrize("rows,n", [(1, 8), (5, 24), (33, 64)])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rmsnorm_and_add(rows, n, offset):
    x, res, _ = _inputs(rows, n, torch.float32)
    w = torch.randn(n, device=DEVICE) * 0.1
    torch.testing.assert_close(norms.rmsnorm(x=x, weight=w, eps=1e-6, offset=offset),
                               norms.rmsnorm_ref(x=x, weight=w, eps=1e-6, offset=offset), rtol=1e-5, atol=1e-5)
    y, r = norms.add_rmsnorm(x=x, residual=res, weight=w, eps=1e-6, offset=offset)
    y_ref, r_ref = norms.add_rmsnorm_ref(x=x, residual=res, weight=w, eps=1e-6, offset=offset)
    torch.testing.assert_close(r, r_ref, rtol=0, atol=0)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    branch = torch.randn(rows, n + 3, device=DEVICE)[:, :n]  # Falcon-H1's second branch, a strided view
    y, r = norms.add_rmsnorm(x=x, residual=res, weight=w, eps=1e-6, offset=offset, branch=branch)
    torch.testing.assert_close(r, (x + branch) + res, rtol=0, atol=0)
    torch.testing.assert_close(y, norms.rmsnorm_ref(x=(x + branch) + res, weight=w, eps=1e-6, offset=offset),
                               rtol=1e-5, atol=1e-5)
    y_ref, r_ref = norms.add_rmsnorm_ref(x=x, residual=res, weight=w, eps=1e-6, offset=offset, branch=branch)
    torch.testing.assert_close(r_ref, r, rtol=0, atol=0)


@pytest.mark.parametrize("rows,n", [(3, 16), (40, 32)])
def test_gated_rmsnorm_and_silu_mul(rows, n):
    x, z, gu = _inputs(rows, n, torch.float32, seed=1)
    w = torch.randn(n, device=DEVICE)
    torch.testing.assert_close(norms.gated_rmsnorm(x=x, z=z, weight=w, eps=1e-6),
                               norms.gated_rmsnorm_ref(x=x, z=z, weight=w, eps=1e-6), rtol=1e-5, atol=1e-5)
    xh = torch.randn(rows, 2, n, device=DEVICE)  # the GDN output [T, H, N]
    zh = torch.randn(rows, 2 * n + 5, device=DEVICE)[:, :2 * n].view(rows, 2, n)  # z: a view into the projection
    torch.testing.assert_close(norms.gated_rmsnorm(x=xh, z=zh, weight=w, eps=1e-6),
                               norms.gated_rmsnorm_ref(x=xh, z=zh, weight=w, eps=1e-6), rtol=1e-5, atol=1e-5)
    strided = torch.randn(rows, 2 * n + 6, device=DEVICE)[:, : 2 * n]  # a slice of a wider projection
    torch.testing.assert_close(norms.silu_and_mul(gate_up=strided), norms.silu_and_mul_ref(gate_up=strided),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norms.relu2(x=strided), norms.relu2_ref(x=strided), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_bf16_matches_eager_roundings():
    x, res, z = _inputs(512, 4096, torch.bfloat16, seed=2)
    w = (torch.randn(4096, device=DEVICE) * 0.1).bfloat16()
    y, r = norms.add_rmsnorm(x=x, residual=res, weight=w, eps=1e-6, offset=1.0)
    y_ref, r_ref = norms.add_rmsnorm_ref(x=x, residual=res, weight=w, eps=1e-6, offset=1.0)
    assert torch.equal(r, r_ref)
    assert (y.float() - y_ref.float()).abs().max() <= 2 ** -6 * y_ref.float().abs().max()
    y, r = norms.add_rmsnorm(x=x, residual=res, weight=w, eps=1e-6, offset=1.0, branch=z)
    assert torch.equal(r, (x + z) + res)  # two roundings, as eager's two adds
    y_ref, _ = norms.add_rmsnorm_ref(x=x, residual=res, weight=w, eps=1e-6, offset=1.0, branch=z)
    assert (y.float() - y_ref.float()).abs().max() <= 2 ** -6 * y_ref.float().abs().max()
    xs, zs = x.view(-1, 128), z.view(-1, 128)
    wg = w[:128]
    g, g_ref = norms.gated_rmsnorm(x=xs, z=zs, weight=wg, eps=1e-6), norms.gated_rmsnorm_ref(x=xs, z=zs, weight=wg,
                                                                                            eps=1e-6)
    assert (g.float() - g_ref.float()).abs().max() <= 2 ** -6 * g_ref.float().abs().max()
    gu = torch.cat([x, z], dim=1)
    assert torch.equal(norms.silu_and_mul(gate_up=gu), norms.silu_and_mul_ref(gate_up=gu))
    assert torch.equal(norms.relu2(x=gu), norms.relu2_ref(x=gu))
