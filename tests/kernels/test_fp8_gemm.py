"""The block-scaled FP8 GEMMs (W8A8 for prefill, weight-only for decode) vs their references
(interpreter on CPU, float32 activations, tiny shapes whose K and N are not multiples of the 128
block), the activation quantization kernel vs its reference, and the weight quantizer's round trip
against the e4m3 format."""

import pytest
import torch
import torch.nn.functional as F

from triton_kernels.fp8_gemm import fp8_gemm, fp8_gemm_ref
from triton_kernels.fp8_quant import (
    FP8_DTYPE,
    dequantize_activations,
    dequantize_fp8,
    quantize_activations,
    quantize_activations_ref,
    quantize_fp8,
)
from triton_kernels.fp8_weight_only import (
    dense_few_rows_gemm,
    fp8_weight_only_gated_gemm,
    fp8_weight_only_gemm,
    fp8_weight_only_gemm_ref,
)
from triton_kernels.norms import silu_and_mul

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _weight(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) / k**0.5
    w[: n // 2] *= 30.0  # blocks of very different magnitudes, so a wrong block's scale shows
    q, s = quantize_fp8(w)
    return q.to(DEVICE), s.to(DEVICE)


def _problem(m: int, n: int, k: int, with_bias: bool, seed: int) -> dict:
    """The GEMMs' keyword arguments: a quantized [n, k] weight, x [m, k] and an optional bias."""
    q, s = _weight(n, k)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g).to(DEVICE)
    bias = torch.randn(n, generator=g).to(DEVICE) if with_bias else None
    return dict(x=x, weight=q, weight_scale_inv=s, bias=bias)


@pytest.mark.parametrize("m,n,k", [(1, 130, 200), (5, 257, 129), (17, 33, 260), (3, 128, 128)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_reference(m, n, k, with_bias):
    kw = _problem(m, n, k, with_bias, seed=1)
    x = kw["x"]
    y = fp8_gemm(**kw)
    assert y.shape == (m, n) and y.dtype == x.dtype
    ref = fp8_gemm_ref(**kw)
    if DEVICE == "cuda":  # Hopper's FP8 MMA sums each 128-wide tile's products in reduced precision
        torch.testing.assert_close(y, ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item())
    else:
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-4)


@pytest.mark.skipif(DEVICE != "cuda", reason="bf16 activations: cuBLAS's block-scaled GEMM, where it takes the shape")
@pytest.mark.parametrize("m,n,k", [(70, 128, 128), (70, 520, 128), (96, 1024, 256)])
def test_bf16_activations_take_cublas_or_triton_by_shape(m, n, k):
    """With bf16 activations cuBLAS's block-scaled GEMM serves the shapes it takes and the Triton kernel the rest;
    asking whether it takes a shape must not raise (torch refuses some small N with a ValueError)."""
    kw = _problem(m, n, k, False, seed=3)
    kw["x"] = kw["x"].to(torch.bfloat16)
    ref = fp8_gemm_ref(**kw).float()
    torch.testing.assert_close(fp8_gemm(**kw).float(), ref, rtol=2e-2, atol=2e-2 * ref.abs().max().item())


def test_each_block_uses_its_own_scale():
    """Scaling one block's scale by 2 doubles exactly that block's contribution."""
    q, s = _weight(200, 300)
    x = torch.randn(4, 300, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    s2 = s.clone()
    s2[1, 2] *= 2.0  # rows 128..199, columns 256..299
    delta = fp8_gemm(x=x, weight=q, weight_scale_inv=s2) - fp8_gemm(x=x, weight=q, weight_scale_inv=s)
    block = dequantize_fp8(q, s)[128:, 256:]
    expected = torch.zeros_like(delta)
    expected[:, 128:] = dequantize_activations(*quantize_activations_ref(x))[:, 256:] @ block.T
    torch.testing.assert_close(delta, expected, rtol=1e-4, atol=1e-4)


def test_quantize_round_trip_is_within_e4m3_rounding():
    """e4m3 keeps 3 mantissa bits: a normal value rounds within 2**-4 of itself; each block's largest
    magnitude maps to 448 exactly, so the scales are amax / 448."""
    w = torch.randn(150, 260, generator=torch.Generator().manual_seed(3))
    q, s = quantize_fp8(w)
    assert q.dtype == FP8_DTYPE and s.shape == (2, 3) and s.dtype == torch.float32
    assert q.float().abs().amax() == 448.0
    back = dequantize_fp8(q, s)
    smallest_normal = 2.0**-6 * s.repeat_interleave(128, 0)[:150].repeat_interleave(128, 1)[:, :260]
    err = (back - w).abs()
    assert (err <= 2.0**-4 * w.abs() + smallest_normal).all()
    assert err.max() > 0  # quantization happened
    assert s[0, 0] == w[:128, :128].abs().amax() / 448.0


def test_activation_groups_are_quantized_per_token():
    """Each token's 128-column group maps its largest magnitude to 448 and rounds to e4m3 (within 2**-4
    of each value, relative to the group's scale), an all-zero group stays zero, and a token's result
    does not depend on the other rows of its batch."""
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, 300, generator=g)
    x[1, 128:256] = 0.0
    x[2] *= 1000.0
    q = dequantize_activations(*quantize_activations_ref(x))
    assert torch.equal(q[1, 128:256], torch.zeros(128))
    for row in range(3):
        for k0 in range(0, 300, 128):
            group, back = x[row, k0:k0 + 128], q[row, k0:k0 + 128]
            scale = group.abs().amax() / 448.0
            assert ((back - group).abs() <= 2.0**-4 * group.abs() + 2.0**-6 * scale + 1e-30).all()
    torch.testing.assert_close(dequantize_activations(*quantize_activations_ref(x[:1])), q[:1], rtol=0, atol=0)
    w, s = _weight(64, 300)
    alone = fp8_gemm(x=x[:1].to(DEVICE), weight=w, weight_scale_inv=s)
    torch.testing.assert_close(alone, fp8_gemm(x=x.to(DEVICE), weight=w, weight_scale_inv=s)[:1],
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("m,k,rows", [(1, 200, 1), (5, 1100, 8), (3, 128, 3), (2, 40, 4)])
def test_activation_kernel_matches_its_reference_bit_for_bit(m, k, rows):
    """e4m3 values and scales equal the reference's; padding rows are zero with scale 1; the scales
    are stored column-major, as cuBLAS's block-scaled GEMM reads them."""
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(5)) * torch.logspace(-3, 3, m)[:, None]
    x[0, :100] = 0.0  # an all-zero group when k <= 128 ... and a partly-zero one otherwise
    q, scale = quantize_activations(x.to(DEVICE), rows=rows)
    ref_q, ref_scale = quantize_activations_ref(x)
    assert q.shape == (rows, k) and q.dtype == FP8_DTYPE and scale.shape == (rows, -(-k // 128))
    assert scale.stride() == (1, rows)
    assert torch.equal(q[:m].cpu().view(torch.uint8), ref_q.view(torch.uint8))
    assert torch.equal(scale[:m].cpu(), ref_scale)
    assert not q[m:].float().any() and (scale[m:] == 1).all()


@pytest.mark.parametrize("m,n,k", [(1, 130, 200), (2, 40, 700), (5, 257, 129), (17, 33, 260), (40, 128, 128)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_weight_only_matches_reference(m, n, k, with_bias):
    """x stays unquantized: the products are those of x with the dequantized weight, to float32 rounding
    (1-2 rows: the CUDA-core kernel, K past two of its tiles; more: the tensor-core one)."""
    kw = _problem(m, n, k, with_bias, seed=6)
    y = fp8_weight_only_gemm(**kw)
    assert y.shape == (m, n) and y.dtype == kw["x"].dtype
    ref = fp8_weight_only_gemm_ref(**kw)
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-4)
    wrong_block = kw["weight_scale_inv"].clone()
    wrong_block[-1, -1] *= 2.0
    assert not torch.allclose(fp8_weight_only_gemm(**{**kw, "weight_scale_inv": wrong_block}), ref, rtol=1e-5,
                              atol=1e-4)


@pytest.mark.parametrize("m,n,k", [(1, 130, 200), (2, 40, 700)])
def test_weight_only_gemv_matches_reference(m, n, k):
    """The CUDA-core kernel itself (on CUDA the dispatch may pick the tensor-core one): the scaled products,
    summed once after the K loop, give the reference's result, and a wrong block scale shows."""
    from triton_kernels.fp8_weight_only import _launch

    kw = _problem(m, n, k, True, seed=16)
    ref = fp8_weight_only_gemm_ref(**kw)
    y = torch.empty_like(ref)
    _launch(kw["x"], kw["weight"], kw["weight_scale_inv"], kw["bias"], y, "gemv")
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-4)
    wrong_block = kw["weight_scale_inv"].clone()
    wrong_block[-1, -1] *= 2.0
    _launch(kw["x"], kw["weight"], wrong_block, kw["bias"], y, "gemv")
    assert not torch.allclose(y, ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m,n,k,with_bias", [(1, 512, 300, False), (2, 256, 700, True), (1, 260, 200, False),
                                             (5, 256, 129, True)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16] if DEVICE == "cuda" else [torch.float32])
def test_gated_weight_only_is_silu_and_mul_of_the_plain_result(m, n, k, with_bias, dtype):
    """A gated MLP's gate_up ([gate; up] rows) through the GEMV with the activation as its epilogue equals the plain
    GEMM followed by silu_and_mul: the up rows' block scales are the right ones (n = 512: two 128-row blocks each),
    and each rounding is the unfused one, bit for bit under the interpreter's one launch config. On CUDA the two
    are tuned apart, and another K tile width sums in another order (float32 rounding, then at most a bf16 ulp).
    n = 260 (I not a multiple of 128) and 5 rows run unfused."""
    kw = _problem(m, n, k, with_bias, seed=17)
    kw["x"] = (kw["x"] * 4).to(dtype)
    if with_bias:
        kw["bias"] = kw["bias"].to(dtype)
    y = fp8_weight_only_gated_gemm(**kw)
    assert y.shape == (m, n // 2) and y.dtype == dtype
    unfused = silu_and_mul(gate_up=fp8_weight_only_gemm(**kw))
    if DEVICE == "cpu":
        assert torch.equal(y, unfused)
    else:
        ulp = 2.0**-7 if dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(y, unfused, rtol=ulp, atol=1e-5)
    ref = F.silu(fp8_weight_only_gemm_ref(**kw).float()[:, :n // 2]) * fp8_weight_only_gemm_ref(**kw)[:, n // 2:]
    torch.testing.assert_close(y.float(), ref.float(), rtol=2e-2 if dtype == torch.bfloat16 else 1e-4, atol=1e-3)


def test_weight_only_refuses_prefill_sized_inputs():
    q, s = _weight(32, 128)
    with pytest.raises(AssertionError, match="use fp8_gemm"):
        fp8_weight_only_gemm(x=torch.zeros(65, 128, device=DEVICE), weight=q, weight_scale_inv=s)


@pytest.mark.parametrize("m,n,k", [(3, 130, 200), (17, 64, 300)])
def test_weight_only_fp16_operands_keep_bf16_inputs_exact(m, n, k):
    """bf16 inputs (here their float32 copies) over a range of 2**40 are scaled per token tile by a power
    of two into fp16 and back: the result is the float32 reference's to float32-sum rounding."""
    from triton_kernels.fp8_weight_only import _launch

    q, s = _weight(n, k)
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(m, k, generator=g) * torch.logspace(-20, 20, m, base=2.0)[:, None]).bfloat16().float()
    x[0, :50] *= 2.0**30  # one tile with a much larger row maximum than the rest of its row
    y = torch.empty(m, n, device=DEVICE)
    _launch(x.to(DEVICE), q, s, None, y, "dot", f16_operands=True)
    ref = fp8_weight_only_gemm_ref(x=x.to(DEVICE), weight=q, weight_scale_inv=s)
    row_max = ref.abs().amax(dim=1, keepdim=True)
    torch.testing.assert_close(y / row_max, ref / row_max, rtol=0, atol=1e-5)


@pytest.mark.parametrize("m,n,k", [(1, 130, 200), (2, 40, 700), (16, 33, 260)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_dense_few_rows_gemm_matches_linear(m, n, k, with_bias):
    """The weight-only kernel unscaled, on a float32 (here) or 16-bit (CUDA) weight, split over K."""
    g = torch.Generator().manual_seed(m + n)
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    x = torch.randn(m, k, generator=g).to(DEVICE, dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(DEVICE, dtype)
    bias = torch.randn(n, generator=g).to(DEVICE, dtype) if with_bias else None
    ref = F.linear(x.float(), w.float(), None if bias is None else bias.float())
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dense_few_rows_gemm(x=x, weight=w, bias=bias).float(), ref, **tol)


@pytest.mark.parametrize("m", [16, 17, 64])
@pytest.mark.parametrize("gated", [False, True])
def test_few_rows_dispatch_serves_a_timed_path(m, gated):
    """fp8_few_rows_gemm (the decode-sized FP8 linear layers) serves the weight-only result below 17 rows and off
    CUDA; from 17 rows on CUDA it serves whichever path timed faster for the shape and row bucket, with that
    path's error (W8A8's is its activation rounding, a few % of a row's norm) and the gated variant equal to
    silu_and_mul of the plain one."""
    from triton_kernels.fp8_few_rows import fp8_few_rows_choice, fp8_few_rows_gated_gemm, fp8_few_rows_gemm

    n, k = 256, 384
    kw = _problem(m, n, k, True, seed=21)
    if DEVICE == "cuda":
        kw["x"], kw["bias"] = kw["x"].bfloat16(), kw["bias"].bfloat16()
    ref = fp8_weight_only_gemm_ref(**kw).float()
    y = (fp8_few_rows_gated_gemm if gated else fp8_few_rows_gemm)(**kw).float()
    choice = fp8_few_rows_choice(kw["x"], kw["weight"], kw["bias"])
    if DEVICE == "cpu" or m < 17:
        assert choice is None
    else:
        assert choice in ("weight-only", "w8a8 cublas", "w8a8 triton")
    if gated:
        ref = F.silu(ref[:, :n // 2]) * ref[:, n // 2:]
    tol = 5e-2 if choice and choice.startswith("w8a8") else (1e-2 if DEVICE == "cuda" else 1e-5)
    assert ((y - ref).norm() / ref.norm()).item() < tol
    if DEVICE == "cpu":
        plain = fp8_weight_only_gemm(**kw)
        assert torch.equal(y, silu_and_mul(gate_up=plain) if gated else plain)
