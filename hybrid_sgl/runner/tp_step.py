"""What rank 0 sends the other tensor-parallel ranks each step, and how they replay it.

Rank 0 runs the only scheduler (with the prefix cache and the grammars) and the only sampler.
Before each forward it sends a StepMessage: the step's StepPlan, the page-table rows of its
slots, how many ids the previous step sampled (an overlapped decode step takes its input tokens
from them), and the state-slot / KV-page copies the prefix cache made since the last step (its
pools are the Recording* ones below). The ids themselves follow by a broadcast from rank 0's device,
so the host never reads them. A rank replays the copies in order, writes the rows into its own page
table and runs the same forward on its shards (a CUDA graph of the same shape where rank 0 replays
one), so its pools hold exactly rank 0's pages and slots for its own heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hybrid_sgl.batch import StepPlan
from hybrid_sgl.memory.kv_pool import KVPool
from hybrid_sgl.memory.state_pool import StatePool


@dataclass(frozen=True)
class StepMessage:
    plan: StepPlan
    table_rows: list[list[int]]  # [B, pages the batch reads] page-table rows of the plan's slots
    prev_len: int | None  # ids the previous step sampled, which the step takes (overlapped decode); they follow
    # by TPGroup.broadcast
    state_copies: list[tuple[int, int]]  # (src, dst) state-pool indices, in order
    kv_copies: list[tuple[int, int]]  # (src, dst) KV pages, in order


class RecordingStatePool(StatePool):
    """Rank 0's state pool: also notes each whole-slot copy for the other ranks."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.copies: list[tuple[int, int]] = []

    def copy_slot(self, src: int, dst: int) -> None:
        super().copy_slot(src, dst)
        self.copies.append((src, dst))

    def copy_slots(self, src: list[int], dst: list[int]) -> None:
        super().copy_slots(src, dst)
        self.copies.extend(zip(src, dst))


class RecordingKVPool(KVPool):
    """Rank 0's KV pool: also notes each page copy for the other ranks."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.copies: list[tuple[int, int]] = []

    def copy_page(self, src: int, dst: int) -> None:
        super().copy_page(src, dst)
        self.copies.append((src, dst))


def _take(pool) -> list[tuple[int, int]]:
    if pool is None:
        return []
    copies, pool.copies = pool.copies, []
    return copies


def step_message(runner, plan: StepPlan, prev_ids) -> StepMessage:
    """The step rank 0's `runner` is about to run, for the other ranks."""
    a = runner.allocator
    pages = -(-plan.max_seq_len // a.page_size)
    rows = [(a.slot_pages[slot] or [])[:pages] for slot in plan.slots]  # the host's copy: no device read
    table = [r + [a.pad_page] * (pages - len(r)) for r in rows]
    return StepMessage(plan=plan, table_rows=table, prev_len=None if prev_ids is None else prev_ids.shape[0],
                       state_copies=_take(runner.state_pool), kv_copies=_take(runner.kv_pool))


def replay(runner, msg: StepMessage) -> None:
    """Run rank 0's step on this rank's shards (its logits are dropped: rank 0 samples)."""
    for src, dst in msg.state_copies:
        runner.state_pool.copy_slot(src, dst)
    for src, dst in msg.kv_copies:
        runner.kv_pool.copy_page(src, dst)
    table = torch.tensor(msg.table_rows, dtype=runner.allocator.page_table.dtype, device=runner.device)
    slots = torch.tensor(msg.plan.slots, dtype=torch.long, device=runner.device)
    runner.allocator.page_table[slots, :table.shape[1]] = table
    prev_ids = None
    if msg.prev_len is not None:  # rank 0 broadcasts them right after the message (ModelRunner.forward_step)
        prev_ids = runner.tp.broadcast(torch.empty(msg.prev_len, dtype=torch.int64, device=runner.device))
    runner.forward_step(msg.plan, prev_ids=prev_ids)
