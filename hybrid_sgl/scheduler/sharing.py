"""The interface through which the scheduler uses a prefix cache, and the null one.

The scheduler holds a BasePrefixSharing and never asks which one: PrefixSharing (prefix_sharing.py)
over a radix cache, or NoPrefixSharing under --disable-radix-cache, which matches nothing, keeps
nothing and leaves pages to the allocator alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable

from hybrid_sgl.memory.allocator import Allocator
from hybrid_sgl.memory.prefix_cache import Match
from hybrid_sgl.runner.model_runner import BatchItem
from hybrid_sgl.scheduler.request import Req


class BasePrefixSharing(ABC):
    """What the scheduler asks of the prefix cache, in the order it asks.

    Admission: `order` the waiting requests, `lookup` each one's reusable prefix (a Match; pos 0 when
    nothing is reused), skip it while `held_back`, `plan_branch`, `lock` the match before making room
    (`unlock` if none can be made), then `admit` it into its new slot. Extend steps: `plan_snapshots`
    before launch, `drop_snapshots` if the step fails, then, while the device computes the step (before
    its results are applied), `snapshots_done` per item and `chunk_done` for each running request.
    Release: `drop_lock`, then `cache_sequence` before the slot is freed. Pages: `ensure_free_pages` may
    evict cached prefixes."""

    allocator: Allocator

    @abstractmethod
    def order(self, waiting: Iterable[Req]) -> list[Req]: ...
    @abstractmethod
    def lookup(self, req: Req) -> Match: ...
    @abstractmethod
    def held_back(self, req: Req, hit: int, prefilling: Iterable[Req]) -> bool: ...
    @abstractmethod
    def plan_branch(self, req: Req, m: Match) -> None: ...
    @abstractmethod
    def lock(self, m: Match) -> None: ...
    @abstractmethod
    def unlock(self, m: Match) -> None: ...
    @abstractmethod
    def admit(self, req: Req, m: Match, slot: int) -> None: ...
    @abstractmethod
    def plan_snapshots(self, items: list[BatchItem], waiting: Iterable[Req]) -> None: ...
    @abstractmethod
    def snapshots_done(self, item: BatchItem) -> None: ...
    @abstractmethod
    def drop_snapshots(self, items: list[BatchItem]) -> None: ...
    @abstractmethod
    def chunk_done(self, req: Req, end: int) -> None: ...
    @abstractmethod
    def cache_sequence(self, req: Req, num_tokens: int | None) -> None: ...
    @abstractmethod
    def drop_lock(self, req: Req) -> None: ...
    @abstractmethod
    def ensure_free_pages(self, n: int) -> bool: ...

    @abstractmethod
    def flush(self) -> None:
        """Empty the cache (no request may hold any of it)."""

    @abstractmethod
    def stats(self) -> dict:
        """Figures for /server_info and /metrics: cached_pages, evictable_pages, num_snapshots,
        snapshot_slots, snapshot_bytes (held), snapshots_taken, snapshots_hit (restores), cache_nodes,
        cache_hit_tokens, cache_lookup_tokens."""

    @abstractmethod
    def check_integrity(self, holders: list[Req]) -> None:
        """The allocator's invariants, counting the cache's references; `holders`: every request
        that may hold a cache node (running, or finished while a step in flight holds its slot)."""


class NoPrefixSharing(BasePrefixSharing):
    """No prefix cache: every request computes its whole prompt, and a freed slot keeps nothing."""

    def __init__(self, allocator: Allocator):
        self.allocator = allocator

    def order(self, waiting: Iterable[Req]) -> list[Req]:
        return list(waiting)

    def lookup(self, req: Req) -> Match:
        return Match(pos=0, pages=[], node=None, snapshot=None, matched=0)

    def held_back(self, req: Req, hit: int, prefilling: Iterable[Req]) -> bool:
        return False

    def plan_branch(self, req: Req, m: Match) -> None:
        pass

    def lock(self, m: Match) -> None:
        pass

    def unlock(self, m: Match) -> None:
        pass

    def admit(self, req: Req, m: Match, slot: int) -> None:
        pass

    def plan_snapshots(self, items: list[BatchItem], waiting: Iterable[Req]) -> None:
        pass

    def snapshots_done(self, item: BatchItem) -> None:
        pass

    def drop_snapshots(self, items: list[BatchItem]) -> None:
        pass

    def chunk_done(self, req: Req, end: int) -> None:
        pass

    def cache_sequence(self, req: Req, num_tokens: int | None) -> None:
        pass

    def drop_lock(self, req: Req) -> None:
        pass

    def ensure_free_pages(self, n: int) -> bool:
        return self.allocator.num_free_pages >= n

    def flush(self) -> None:
        pass

    def stats(self) -> dict:
        return {"cached_pages": 0, "evictable_pages": 0, "num_snapshots": 0, "snapshot_slots": 0, "snapshot_bytes": 0,
                "snapshots_taken": 0, "snapshots_hit": 0, "cache_nodes": 0, "cache_hit_tokens": 0,
                "cache_lookup_tokens": 0}

    def check_integrity(self, holders: list[Req]) -> None:
        self.allocator.check_integrity()
