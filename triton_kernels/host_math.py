"""Integer helpers for host code that sizes launches: the values of triton.cdiv and triton.next_power_of_2,
as plain functions. Triton's own are constexpr functions, callable from kernels too, and cost ~2.5 us a host
call in that wrapper against ~0.1 us here; an eager step sizes its ~250 launches with ~800 such calls."""


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for b > 0: triton.cdiv's value."""
    return (a + b - 1) // b


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (0 for n <= 0): triton.next_power_of_2's value."""
    n = int(n)
    return 1 << (n - 1).bit_length() if n > 0 else 0
