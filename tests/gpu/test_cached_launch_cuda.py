"""Cached launches on CUDA give the bits Triton's own launches give, through changing shapes, unaligned
views, dtypes and an autotuned kernel, and really skip Triton's launch path after the first call of a
specialization. Skipped without CUDA."""

import pytest
import torch

from triton_kernels import cached_launch as cl
from triton_kernels.fp8_weight_only import dense_few_rows_gemm
from triton_kernels.norms import add_rmsnorm, rmsnorm, silu_and_mul

pytestmark = pytest.mark.gpu


def _cases(dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    big = torch.randn(17 * 512 + 8, device="cuda", generator=g).to(dtype)
    for rows, width, offset in [(1, 256, 0), (3, 256, 0), (5, 256, 1), (5, 256, 8), (17, 512, 0), (1, 256, 3)]:
        x = big[offset:offset + rows * width].view(rows, width)  # offset 1, 3: not 16-byte aligned
        r = torch.randn(rows, width, device="cuda", generator=g).to(dtype)
        w = torch.randn(width, device="cuda", generator=g).to(dtype)
        yield x, r, w, torch.randn(64, width, device="cuda", generator=g).to(dtype)


def _outputs(dtype):
    out = []
    for x, r, w, weight in _cases(dtype):
        out += [rmsnorm(x=x, weight=w, eps=1e-6), *add_rmsnorm(x=x, residual=r, weight=w, eps=1e-5, offset=1.0),
                silu_and_mul(gate_up=torch.cat([x, r], dim=1))]
        if x.shape[0] <= 16:
            out.append(dense_few_rows_gemm(x=x, weight=weight))  # autotuned
    return out


@pytest.mark.parametrize("direct", [True, False], ids=["direct C launch", "launcher object"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cached_launches_equal_tritons(dtype, direct, monkeypatch):
    monkeypatch.setattr(cl, "DIRECT_C_LAUNCH", direct and cl.triton.__version__.startswith("3.6."))
    monkeypatch.setattr(cl, "ENABLED", False)
    expected = _outputs(dtype)
    monkeypatch.setattr(cl, "ENABLED", True)
    first = _outputs(dtype)  # fills the caches (a first call per specialization is Triton's own launch)
    firsts = []
    real_first = cl.CachedLaunch._first_launch
    monkeypatch.setattr(cl.CachedLaunch, "_first_launch",
                        lambda self, *a: (firsts.append(self), real_first(self, *a))[1])
    again = _outputs(dtype)
    torch.cuda.synchronize()
    assert not firsts, "every specialization was cached on the first pass"
    for e, f, a in zip(expected, first, again, strict=True):
        assert torch.equal(e, f) and torch.equal(e, a)


def test_direct_c_launch_serves_the_project_kernels(monkeypatch):
    """On the Triton version it is written for, every cached entry these kernels made can launch directly."""
    if not cl.triton.__version__.startswith("3.6."):
        pytest.skip(f"no direct C launch for triton {cl.triton.__version__}")
    monkeypatch.setattr(cl, "DIRECT_C_LAUNCH", True)
    _outputs(torch.bfloat16)
    from triton_kernels import fp8_weight_only, norms
    entries = [e for k in (norms._rmsnorm_kernel, norms._silu_and_mul_kernel, fp8_weight_only._dot_tuned)
               for e in k.compiled.values()]
    assert entries and all(e.direct for e in entries)


def test_cached_launches_replay_in_a_cuda_graph():
    x = torch.randn(4, 256, device="cuda")
    w = torch.randn(256, device="cuda")
    eager = rmsnorm(x=x, weight=w, eps=1e-6)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = rmsnorm(x=x, weight=w, eps=1e-6)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, rmsnorm(x=x, weight=w, eps=1e-6)) and not torch.equal(y, eager)
