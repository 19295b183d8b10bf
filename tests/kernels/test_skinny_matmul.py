"""The decode-size matmul vs its torch reference: ragged M, N and K (masks), the fused SiLU-gated
input, block choices, and a Hopper compile without spills."""

import pytest
import torch

from tests.kernels.sm90 import compile_sm90_in_subprocess
from triton_kernels.skinny_matmul import default_blocks, skinny_matmul, skinny_matmul_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(m, n, k, *, act="none", dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, 2 * k if act == "silu_mul" else k, generator=g).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEVICE, dtype)
    return x, w


@pytest.mark.parametrize("m,n,k", [(1, 16, 32), (3, 40, 48), (16, 64, 300), (33, 24, 64)])
@pytest.mark.parametrize("act", ["none", "silu_mul", "relu2"])
def test_matches_ref(m, n, k, act):
    x, w = _inputs(m, n, k, act=act)
    blocks = {"BLOCK_N": 16, "BLOCK_K": 32, "num_warps": 4, "num_stages": 1}
    y = skinny_matmul(x=x, weight=w, act=act, blocks=blocks)
    assert y.shape == (m, n)
    torch.testing.assert_close(y, skinny_matmul_ref(x=x, weight=w, act=act), rtol=1e-4, atol=1e-4)


def test_strided_rows_and_default_blocks():
    """x may be a row-strided view (a slice of a wider projection); default blocks cover N by ≥ 16."""
    g = torch.Generator().manual_seed(1)
    wide = torch.randn(5, 80, generator=g).to(DEVICE)
    x = wide[:, :64]
    w = torch.randn(48, 64, generator=g).to(DEVICE)
    torch.testing.assert_close(skinny_matmul(x=x, weight=w), skinny_matmul_ref(x=x, weight=w), rtol=1e-4, atol=1e-4)
    assert default_blocks(4096, 1, torch.device("cpu"))["BLOCK_N"] == 64  # 8 "SMs" on CPU
    assert default_blocks(16, 1, torch.device("cpu"))["BLOCK_N"] == 16


def test_rejects_mismatched_shapes():
    x, w = _inputs(2, 16, 32)
    with pytest.raises(AssertionError, match="does not match"):
        skinny_matmul(x=x, weight=w, act="silu_mul")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 32])
@pytest.mark.parametrize("act", ["none", "silu_mul", "relu2"])
def test_bf16_down_proj_shape(m, act):
    """bf16 at the 9B down_proj shape (K = 12288): within bf16 rounding of the float32 result."""
    x, w = _inputs(m, 4096, 12288, act=act, dtype=torch.bfloat16, seed=2)
    y = skinny_matmul(x=x, weight=w, act=act).float()
    ref = skinny_matmul_ref(x=x, weight=w, act=act).float()
    assert (y - ref).abs().max() <= 2 ** -7 * ref.abs().max()


SKINNY_SM90 = r'''
from triton_kernels import skinny_matmul as sm
types = dict(x="*bf16", w="*bf16", out="*bf16")
for m in (1, 64):
    for act in (0, 1, 2):
        cfg = sm.default_blocks(4096, m, torch.device("cpu"))  # BLOCK_N 64: the largest tile
        warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
        out[f"m{m} act {act}"] = compile_sm90(
            sm._skinny_matmul_kernel, types, dict(ACT=act, BLOCK_M=max(16, m), **cfg), warps, stages)
print(json.dumps(out))
'''


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the tests above run the compiled kernel")
def test_compiles_for_hopper_without_spills():
    results = compile_sm90_in_subprocess(SKINNY_SM90)
    assert len(results) == 6 and all(spilled == 0 for _, spilled in results.values()), results
