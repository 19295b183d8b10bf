"""The host-side launch-sizing helpers give Triton's values (triton.cdiv and triton.next_power_of_2 are constexpr
functions, ~25x slower a host call)."""

import triton

from triton_kernels.host_math import cdiv, next_power_of_2


def test_values_are_tritons():
    for n in [*range(-5, 4100), 2**31 - 1, 2**31, 2**40 + 3]:
        assert next_power_of_2(n) == triton.next_power_of_2(n), n
        for b in (1, 2, 3, 16, 64, 100, 4096):
            assert cdiv(n, b) == triton.cdiv(n, b), (n, b)
