"""Zeroed int32 counters for kernels whose last-arriving program finishes a shared piece of work
(split-K sums, MoE slot sums): each program adds 1 to its piece's counter after writing its part; the
one that sees count - 1 reads the others' parts, writes the result and sets the counter back to 0.

One buffer per device, shared by every such kernel: each launch leaves its counters at 0, and a
stream runs one launch at a time. Made once and never replaced, so captured decode graphs that
point at it stay valid."""

import torch

MAX_COUNTERS = 1 << 16
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def arrival_counters(device: torch.device, needed: int) -> torch.Tensor:
    """[MAX_COUNTERS] int32 zeros on `device` (needed: how many the launch uses, checked)."""
    assert needed <= MAX_COUNTERS, f"{needed} counters: more than the {MAX_COUNTERS} there are"
    device = torch.device(device)
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(MAX_COUNTERS, dtype=torch.int32, device=device)
    return _COUNTERS[device]
