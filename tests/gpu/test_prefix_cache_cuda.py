"""The prefix-cache scenario of tests/test_prefix_cache_families.py on CUDA through the Triton
kernels with decode CUDA graphs: the recurrent layers' segmented rounds, the snapshot copies and
the tail-page copies on the device. Skipped without CUDA."""

import pytest

from tests.gpu.test_model_cuda import BACKENDS, FAMILIES
from tests.test_prefix_cache_families import assert_same_outputs, check_predicted_cached_tokens, run_both

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("family", FAMILIES)
def test_cuda_cache_on_equals_cache_off(tiny_checkpoint, family):
    plain, cached = run_both(tiny_checkpoint(family), device="cuda", **BACKENDS["triton"])
    for case in plain:
        assert_same_outputs(plain[case], cached[case], tol=5e-4)
    check_predicted_cached_tokens(cached)
