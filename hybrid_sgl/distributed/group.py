"""The tensor-parallel group of this process: rank, size, and the collectives the layers use.

A model is built inside `building_with(tp)`; each layer reads `current_tp()` once in its
constructor and keeps it. Nothing reads it at run time, so a process may build a tp 1 model
after a tp 2 one (tests do). At size 1 there is no process group and the helpers are never
called: the tp 1 path has no extra ops.
"""

from __future__ import annotations

import contextlib
import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    rank: int = 0
    size: int = 1
    group: dist.ProcessGroup | None = None  # None at size 1
    expert_parallel: bool = False  # --ep-size = size: MoE blocks deal their routed experts out whole

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of x over the ranks, in place. x: any shape, the same on every rank."""
        dist.all_reduce(x, group=self.group)
        return x

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's x on every rank, in place. x: contiguous, the same shape and dtype on every rank."""
        dist.broadcast(x, src=0, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """x: [N, C] on each rank -> [N, size * C], rank r's columns at [r * C, (r + 1) * C)."""
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)

    def check_same(self, what: str, values: tuple[int, ...]) -> None:
        """Raise unless every rank holds the same `values` (e.g. the memory plan's slot and page counts)."""
        t = torch.tensor([values], dtype=torch.int64, device=_collective_device(self.group))
        ranks = self.all_gather(t).view(self.size, len(values)).tolist()
        if any(r != ranks[0] for r in ranks):
            raise RuntimeError(f"the tensor-parallel ranks disagree on {what}: {ranks} (one row per rank); "
                               "they must build identical pools")

    def min_int(self, value: int) -> int:
        """The smallest of an int over the ranks (memory budgets, so the plans agree)."""
        t = torch.tensor([value], dtype=torch.int64, device=_collective_device(self.group))
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t.item())


SINGLE = TPGroup()
_building: list[TPGroup] = [SINGLE]


def current_tp() -> TPGroup:
    """The group of the model being built (SINGLE outside `building_with`)."""
    return _building[-1]


@contextlib.contextmanager
def building_with(tp: TPGroup):
    _building.append(tp)
    try:
        yield
    finally:
        _building.pop()


def init_tp(rank: int, size: int, init_method: str, device: torch.device, expert_parallel: bool = False) -> TPGroup:
    """Join the tensor-parallel process group (gloo on CPU, NCCL on CUDA). Every rank calls this."""
    if size == 1:
        return SINGLE
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":  # one host: rank r drives GPU r ("cuda" then means that GPU in this process)
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=size,
                            timeout=datetime.timedelta(minutes=30))
    return TPGroup(rank=rank, size=size, group=dist.group.WORLD, expert_parallel=expert_parallel)


def destroy_tp(tp: TPGroup) -> None:
    if tp.size > 1 and dist.is_initialized():
        dist.destroy_process_group()


def _collective_device(group) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" \
        else torch.device("cpu")
