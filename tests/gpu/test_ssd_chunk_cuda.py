"""mamba2_prefill on CUDA at the Nemotron-H-8B Mamba2 shape (H 128, P 64, N 128, G 8, chunks of 128)
against the sequential reference run in float32 on the GPU. Skipped without CUDA.

bf16 inputs (the matmul operands, and the state entering each chunk, are bf16 in the kernels; the
state itself accumulates in fp32), fp32 state pool; a few hundred tokens keep the sequential
reference quick."""

import pytest
import torch

from tests.kernels.test_ssd_chunk import batch_args, pool, ssd_inputs
from triton_kernels.ssd_chunk import mamba2_prefill, mamba2_prefill_ref

pytestmark = pytest.mark.gpu

H, G, P, N, CHUNK = 128, 8, 64, 128, 128


def rel_err(x, ref):
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def nemotron_inputs(num_tokens, *, gated, dtype, seed=0):
    """Model-like magnitudes: A = -(1..16); dt_bias the inverse softplus of 1e-3..1e-1 (log-uniform)."""
    x = ssd_inputs(num_tokens, H, G, P, N, gated=gated, dtype=dtype, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    dt0 = torch.exp(torch.empty(H).uniform_(-6.9, -2.3, generator=g))  # log-uniform in [1e-3, 1e-1]
    x["A_log"] = torch.log(torch.empty(H).uniform_(1, 16, generator=g)).to(x["x"].device)
    x["dt_bias"] = (dt0 + torch.log(-torch.expm1(-dt0))).to(x["x"].device)  # inverse softplus
    return x


def compare(lens, slots, has_init, *, gated, dtype=torch.bfloat16, chunk_size=CHUNK, y_tol=1e-2, s_tol=1e-2):
    x = nemotron_inputs(sum(lens), gated=gated, dtype=dtype)
    states = pool(max(slots) + 2, H, P, N)
    args = batch_args(lens, slots, has_init)
    ours, ref = states.clone(), states.clone()
    y = mamba2_prefill(**x, **args, ssm_states=ours, chunk_size=chunk_size)
    y_ref = mamba2_prefill_ref(**{k: v.float() if v is not None and v.dtype == dtype else v for k, v in x.items()},
                               **args, ssm_states=ref)
    assert y.dtype == dtype and torch.isfinite(y).all()
    assert rel_err(y, y_ref) < y_tol, rel_err(y, y_ref)
    assert rel_err(ours, ref) < s_tol, rel_err(ours, ref)
    untouched = [s for s in range(states.shape[0]) if s not in slots]
    assert torch.equal(ours[untouched], states[untouched])


@pytest.mark.parametrize("gated", [False, True], ids=["no_z", "z"])
def test_bf16_varlen(gated):
    """Sequences of 1, chunk - 1, chunk, chunk + 1 and 2 chunks + 3 tokens, mixed initial states,
    unordered slots."""
    lens = [1, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 3]
    compare(lens, [5, 0, 3, 1, 6], [True, False, True, False, True], gated=gated)


def test_bf16_chunk_256_config():
    """Falcon-H1 / Granite configs say 256-token chunks; the kernels tile them by 128."""
    compare([300, 41], [1, 0], [True, True], gated=False, chunk_size=256)


def test_float32_close_to_reference():
    """float32 inputs take three-pass tf32 matmuls: close to the float32 reference."""
    compare([3, 200], [0, 2], [True, False], gated=True, dtype=torch.float32, y_tol=1e-4, s_tol=1e-4)
