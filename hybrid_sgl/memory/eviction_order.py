"""The order in which the prefix cache gives up snapshots: lowest priority first, then least recently used,
then oldest (`eviction_key`). A heap of (key, snapshot) entries beside the cache's snapshots: a snapshot is
entered again whenever its key changes, and an entry whose snapshot was evicted or re-entered since is stale
and dropped when it reaches the top. So the next victim costs O(log n) instead of a scan of every snapshot."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hybrid_sgl.memory.prefix_cache import Snapshot


def eviction_key(snap: Snapshot) -> tuple[float, int, int]:
    return snap.priority, snap.last_used, snap.born


class EvictionOrder:
    """live: the cache's snapshots (the dict it keeps them in; read, never changed here)."""

    def __init__(self, live: dict[Snapshot, None]):
        self.live = live
        self._heap: list[tuple[tuple[float, int, int], Snapshot]] = []

    def rank(self, snap: Snapshot) -> None:
        """Enter snap after it was added or its priority or last use changed."""
        heapq.heappush(self._heap, (eviction_key(snap), snap))
        if len(self._heap) > 4 * len(self.live) + 64:  # mostly stale entries: rebuild
            self._heap = [(eviction_key(s), s) for s in self.live]
            heapq.heapify(self._heap)

    def _current(self, entry: tuple) -> bool:
        key, snap = entry
        return snap in self.live and eviction_key(snap) == key

    def cheapest(self) -> Snapshot | None:
        """The unpinned snapshot evicted first, or None (pinned ones are set aside while the top is found)."""
        pinned, found = [], None
        while self._heap:
            entry = self._heap[0]
            if not self._current(entry):
                heapq.heappop(self._heap)
            elif entry[1].pins:
                pinned.append(heapq.heappop(self._heap))
            else:
                found = entry[1]
                break
        for entry in pinned:
            heapq.heappush(self._heap, entry)
        return found

    def check_integrity(self) -> None:
        current = {id(e[1]) for e in self._heap if self._current(e)}
        assert all(id(s) in current for s in self.live), "a snapshot is missing from the eviction order"
