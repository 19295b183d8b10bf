"""Zeroed int32 counters for kernels whose last-arriving program finishes a shared piece of work
(split-K sums, MoE slot sums): each program adds 1 to its piece's counter after writing its part; the
one that sees count - 1 reads the others' parts, writes the result and sets the counter back to 0.

One counter buffer per device, shared by every such kernel: each launch leaves its counters at 0, and
a stream runs one launch at a time. Made once and never replaced, so captured decode graphs that
point at it stay valid. The float32 parts the programs write are scratch of the same kind
(`parts_scratch`): one buffer per device and size, shared by the launches that need that size.
"""

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


_SCRATCH: dict[tuple[torch.device, int], torch.Tensor] = {}


def parts_scratch(device: torch.device, numel: int) -> torch.Tensor:
    """[numel] float32 scratch on `device` for a launch's parts, made once per size and never replaced
    (no allocation per call). Its contents live within one launch: the last arriver reads the parts
    before the launch ends, so launches of one stream, of one layer or of the next, share it in turn."""
    key = (torch.device(device), numel)
    if key not in _SCRATCH:
        _SCRATCH[key] = torch.empty(numel, dtype=torch.float32, device=device)
    return _SCRATCH[key]
