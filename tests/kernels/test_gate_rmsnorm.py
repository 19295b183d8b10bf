"""gate_rmsnorm (Triton) vs gate_rmsnorm_ref: the Mamba2 output norm, gate first, by channel groups.
Interpreter on CPU in float32; bf16 on GPU, where the roundings must match eager's."""

import pytest
import torch

from tests.kernels.sm90 import compile_sm90_in_subprocess
from triton_kernels.norms import gate_rmsnorm, gate_rmsnorm_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def inputs(rows, d, *, dtype=torch.float32, seed=0):
    """x [T, D] (the scan output, contiguous), z [T, D] (a slice of the in_proj row), weight [D]."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, d, generator=g).to(DEVICE, dtype)
    z = torch.randn(rows, d + 7, generator=g).to(DEVICE, dtype)[:, 5 : d + 5]
    weight = (1 + 0.3 * torch.randn(d, generator=g)).to(DEVICE, dtype)
    return dict(x=x, z=z, weight=weight)


@pytest.mark.parametrize("rows,d,groups", [(1, 16, 1), (5, 48, 1), (7, 48, 3), (33, 64, 4), (3, 96, 8)])
def test_matches_ref(rows, d, groups):
    """group_size = D (the whole row) and D / G; group sizes that are not powers of two are masked."""
    kw = dict(**inputs(rows, d), eps=1e-5, group_size=d // groups)
    y = gate_rmsnorm(**kw)
    torch.testing.assert_close(y, gate_rmsnorm_ref(**kw), rtol=1e-5, atol=1e-5)
    assert y.is_contiguous()


def test_groups_are_normalized_apart():
    """Scaling one group of x leaves the others' outputs unchanged (and that group's too: RMSNorm is
    scale-invariant), where a whole-row norm would change them all."""
    kw = dict(**inputs(4, 32), eps=1e-6, group_size=8)
    y = gate_rmsnorm(**kw)
    scaled = kw["x"].clone()
    scaled[:, 8:16] *= 100.0
    torch.testing.assert_close(gate_rmsnorm(**{**kw, "x": scaled}), y, rtol=1e-5, atol=1e-5)
    whole = dict(kw, group_size=32)
    assert (gate_rmsnorm(**{**whole, "x": scaled}) - gate_rmsnorm(**whole)).abs().max() > 0.1


def test_rejects_ragged_groups():
    with pytest.raises(AssertionError, match="group_size"):
        gate_rmsnorm(**inputs(2, 48), eps=1e-6, group_size=32)


@pytest.mark.gpu
@pytest.mark.parametrize("group_size", [1024, 8192])
def test_bf16_nemotron_shape(group_size):
    """Nemotron-H-8B: D = 8192 in 8 groups of 1024 (and the whole row), bf16 weights and activations."""
    kw = dict(**inputs(512, 8192, dtype=torch.bfloat16, seed=2), eps=1e-5, group_size=group_size)
    y, y_ref = gate_rmsnorm(**kw), gate_rmsnorm_ref(**kw)
    assert (y.float() - y_ref.float()).abs().max() <= 2 ** -6 * y_ref.float().abs().max()


NORM_SM90 = r'''
from triton_kernels import norms
BF16 = "*bf16"
types = dict(x=BF16, z=BF16, w=BF16, y=BF16, eps="fp32")
for group_size in (1024, 8192):  # Nemotron-H-8B: 8 groups of 1024; a whole 8192 row
    block_r, block_g, warps = norms._gate_rmsnorm_config(group_size)
    out[f"group {group_size}"] = compile_sm90(norms._gate_rmsnorm_kernel, types,
                                              dict(BLOCK_R=block_r, BLOCK_G=block_g), warps, 1)
print(json.dumps(out))
'''


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the tests above run the compiled kernel")
def test_compiles_for_hopper_without_spills():
    results = compile_sm90_in_subprocess(NORM_SM90)
    assert len(results) == 2 and all(spilled == 0 for _, spilled in results.values()), results
