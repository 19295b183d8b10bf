"""16-bit linears at decode sizes (layers/linear.py: dense_linear): whichever of cuBLAS and the
few-rows kernel serves a shape, the result is F.linear's to bf16 rounding, also replayed from a CUDA
graph captured after the choice was made. Skipped without CUDA."""

import pytest
import torch
import torch.nn.functional as F

from hybrid_sgl.layers.linear import dense_linear, dense_linear_choice

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("n,k", [(2048, 4096), (12352, 2048), (300, 1000)])
@pytest.mark.parametrize("m", [1, 3, 16])
def test_matches_cublas_and_replays(n, k, m):
    g = torch.Generator(device="cuda").manual_seed(n + m)
    w = (torch.randn(n, k, generator=g, device="cuda") / k**0.5).bfloat16()
    x = torch.randn(m, k, generator=g, device="cuda").bfloat16()
    ref = F.linear(x.float(), w.float())
    torch.testing.assert_close(dense_linear(x, w, None).float(), ref, rtol=2e-2, atol=2e-2)
    assert dense_linear_choice(x, w, None) in ("cublas", "ours")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = dense_linear(x, w, None)
    x.copy_(torch.randn(m, k, generator=g, device="cuda").bfloat16())
    graph.replay()
    torch.testing.assert_close(out.float(), F.linear(x.float(), w.float()), rtol=2e-2, atol=2e-2)
