"""The host-side launch-sizing helpers give Triton's values (triton.cdiv and triton.next_power_of_2 are constexpr
functions, ~25x slower a host call). Checked by their definitions, and against Triton's own functions in a fresh
interpreter: inside a test process the Triton interpreter patches `triton`'s functions while it runs a kernel."""

import json
import subprocess
import sys

from triton_kernels.host_math import cdiv, next_power_of_2

VALUES = [*range(0, 4100), 2**31 - 1, 2**31, 2**40 + 3]
DIVISORS = (1, 2, 3, 16, 64, 100, 4096)


def test_definitions():
    for n in VALUES:
        p = next_power_of_2(n)
        assert (p == 0) if n == 0 else (p & (p - 1) == 0 and p >= n > p // 2), n
        for b in DIVISORS:
            q = cdiv(n, b)
            assert q * b >= n > (q - 1) * b, (n, b)
    assert next_power_of_2(-3) == 0


def test_values_are_tritons():
    code = ("import json, triton; v = " + repr(VALUES) + "; d = " + repr(DIVISORS) + "; print(json.dumps("
            "[[triton.next_power_of_2(n) for n in v], [[triton.cdiv(n, b) for b in d] for n in v]]))")
    powers, quotients = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                                  text=True).stdout)
    assert powers == [next_power_of_2(n) for n in VALUES]
    assert quotients == [[cdiv(n, b) for b in DIVISORS] for n in VALUES]
