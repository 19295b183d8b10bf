"""Prefix cache for hybrid models: a radix tree over token ids that holds KV pages, plus snapshots
of the recurrent state at chosen positions.

A recurrent layer cannot restart at an arbitrary position from pages; it needs a copy of its
state taken at exactly that position. So a cached prefix is usable up to the deepest *snapshot*
on its path, not up to the deepest page:

    node   : a run of whole pages (`key` = their tokens, a multiple of page_size long). Children are
             keyed by their first page's tokens. Every node boundary is page-aligned.
    snapshot at position p: a state-pool index holding the state after tokens [0, p), and, when p
             is not page-aligned, the `tail` tokens [floor(p), p) with a reference to the page
             holding their KV (the prefix's last, partial page). It hangs on the node whose range
             (start, end] contains floor(p) (the root when floor(p) == 0).

A request that matches a snapshot at p gets shared references to the pages of [0, floor(p)), a
private copy of the tail page (it writes positions >= p into it), and a copy of the state; it
then computes from p. For a model without recurrent layers every page boundary is a free
snapshot. Reference counts live in the allocator: the cache holds one per node page and one per
tail page. A running request locks the path it reuses (`lock` counts on the node and all its
ancestors). Unlocked leaves are evicted least recently used first, and a node with no snapshot
below it is useless for a hybrid model and goes at once.

Snapshots are evicted by value (greedy-dual-size-frequency): every snapshot costs the same bytes
(one state slot), and is worth the tokens it `saves` (its position less the deepest snapshot
above it on its path, when it was taken or last used: one whose neighbours above were evicted is
worth more at its next use) times how often it was used. Its `priority` is
`inflation + uses * saves`, where `inflation` is the priority of the last snapshot evicted, so
that one that stopped being used ages out however much it once saved. A new snapshot worth less
than every snapshot held is not taken when the pool is full.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hybrid_sgl.memory.allocator import Allocator, OutOfPages
from hybrid_sgl.memory.eviction_order import EvictionOrder, eviction_key
from hybrid_sgl.memory.kv_pool import KVPool
from hybrid_sgl.memory.state_pool import StatePool


@dataclass(eq=False)
class Snapshot:
    pos: int
    index: int  # state-pool index
    tail: tuple[int, ...]  # tokens [floor(pos), pos)
    tail_page: int | None  # page with the tail's KV (None when tail is empty)
    node: Node | None = None  # the node it hangs on
    last_used: int = 0
    saves: int = 0  # tokens it saves over the deepest snapshot above it on its path
    uses: int = 1  # taken, plus restored
    priority: float = 0.0  # inflation at its last use + uses * saves: the lowest is evicted first
    pins: int = 0  # admissions that matched it and have not restored it yet: not evicted meanwhile
    born: int = 0  # creation order: of two snapshots of equal priority and last use, the older goes first


@dataclass(eq=False)
class Node:
    key: tuple[int, ...]
    pages: list[int]
    start: int  # position of the first token of key
    parent: Node | None = None
    children: dict[tuple[int, ...], Node] = field(default_factory=dict)
    snapshots: list[Snapshot] = field(default_factory=list)
    lock: int = 0  # running requests using this node or a descendant
    last_used: int = 0

    @property
    def end(self) -> int:
        return self.start + len(self.key)


@dataclass
class Match:
    """The reusable prefix of a token list: restore `snapshot` (None = stateless model or nothing)
    and reuse `pages` for [0, floor(pos)); `node` is the node to lock; `matched` is how deep the
    token list follows the cache (>= pos): cached pages, or a snapshot past the lookup's limit."""

    pos: int
    pages: list[int]
    node: Node
    snapshot: Snapshot | None
    matched: int


class PrefixCache:
    def __init__(self, *, allocator: Allocator, state_pool: StatePool | None, kv_pool: KVPool | None):
        self.allocator = allocator
        self.state_pool = state_pool
        self.kv_pool = kv_pool
        self.page_size = allocator.page_size
        self.stateful = state_pool is not None
        self.root = Node(key=(), pages=[], start=0)
        self._clock = itertools.count(1)
        self._snapshots: dict[Snapshot, None] = {}  # every snapshot held
        self._order = EvictionOrder(self._snapshots)  # which snapshot goes first when slots run out
        self._born = itertools.count()
        self._inflation = 0.0  # priority of the last snapshot evicted
        self.hit_tokens = 0  # tokens restored from the cache, over all admissions
        self.lookup_tokens = 0  # prompt tokens looked up
        self.snapshots_taken = 0
        self.snapshots_hit = 0  # restores of a snapshot

    # ---- lookup ------------------------------------------------------------------------------------
    def match(self, tokens: list[int], limit: int) -> Match:
        """Longest reusable prefix of `tokens` ending at a position <= limit."""
        ps, node, pos, pages = self.page_size, self.root, 0, []
        path = [(self.root, 0)]  # (node, tokens of it that match)
        while pos + ps <= len(tokens):
            child = node.children.get(tuple(tokens[pos:pos + ps]))
            if child is None:
                break
            k = _common_pages(child.key, tokens, pos, ps)
            pages.extend(child.pages[:k])
            path.append((child, k * ps))
            if k * ps < len(child.key):
                break
            pos, node = pos + len(child.key), child
        matched = len(pages) * ps
        if not self.stateful:
            usable = min(matched, limit // ps * ps)
            deepest = self.root
            for n, _ in path:
                if n.start < usable or n is self.root:
                    deepest = n
            return Match(pos=usable, pages=pages[:usable // ps], node=deepest, snapshot=None, matched=matched)
        best, best_node = None, self.root
        for n, used in path:
            for snap in n.snapshots:
                floor = snap.pos - len(snap.tail)
                if floor > n.start + used or tuple(tokens[floor:snap.pos]) != snap.tail:
                    continue
                matched = max(matched, snap.pos)  # cached state further on, past the limit
                if snap.pos <= limit and (best is None or snap.pos > best.pos):
                    best, best_node = snap, n
        if best is None:
            return Match(pos=0, pages=[], node=self.root, snapshot=None, matched=matched)
        floor = best.pos - len(best.tail)
        return Match(pos=best.pos, pages=pages[:floor // ps], node=best_node, snapshot=best, matched=matched)

    def restore(self, m: Match, slot: int) -> None:
        """Give the empty `slot` the matched prefix: shared pages, a private copy of the tail page,
        the state. Lock `m.node` first (see `lock`). Raises OutOfPages (slot unchanged) when the
        tail page cannot be had."""
        tail_copy = None
        if m.snapshot is not None and m.snapshot.tail_page is not None:
            tail_copy = self.allocator.alloc_page()
            if self.kv_pool is not None:
                self.kv_pool.copy_page(m.snapshot.tail_page, tail_copy)
        self.allocator.attach(slot, m.pages + ([tail_copy] if tail_copy is not None else []))
        if tail_copy is not None:
            self.allocator.unref_page(tail_copy)  # the slot's reference is the only one now
        if m.snapshot is not None:
            self.state_pool.copy_slot(m.snapshot.index, slot)
        now = next(self._clock)
        if m.snapshot is not None:
            snap = m.snapshot
            snap.last_used, snap.uses = now, snap.uses + 1
            snap.saves = snap.pos - self._deepest_snapshot_above(snap.node, self._path_tokens(snap))
            snap.priority = self._inflation + snap.uses * snap.saves
            self._order.rank(snap)
            self.snapshots_hit += 1
        n = m.node
        while n is not None:
            n.last_used = now
            n = n.parent

    # ---- locks -------------------------------------------------------------------------------------
    def pin(self, m: Match, delta: int) -> None:
        """Keep (+1) or let go (-1) the snapshot a match restores, between admission and restore."""
        if m.snapshot is not None:
            m.snapshot.pins += delta
            assert m.snapshot.pins >= 0, "snapshot unpinned more often than pinned"

    def lock(self, node: Node) -> None:
        while node is not None:
            node.lock += 1
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not None:
            node.lock -= 1
            assert node.lock >= 0, "prefix-cache node unlocked more often than locked"
            node = node.parent

    # ---- insert ------------------------------------------------------------------------------------
    def insert(self, tokens: list[int], pages: list[int], slot: int | None, keep: bool,
               filled: int | None = None, saves: int | None = None) -> Node:
        """Cache the prefix `tokens` whose KV sits in `pages` (a running slot's page list) and a
        snapshot of the state after it: copied from `slot`, or already copied to the snapshot slot
        `filled` (see take_snapshot_slot). saves: the tokens the snapshot is worth (default: over the
        deepest snapshot above it). Returns the node holding the last whole page; with keep, that node
        comes back locked (the slot still writes past it: call `release` when done), else a node left
        without a snapshot below it is dropped."""
        ps = self.page_size
        whole = len(tokens) // ps * ps
        node = self._insert_pages(tokens[:whole], pages[:whole // ps])
        self.lock(node)
        if slot is not None or filled is not None:
            self._snapshot_at(node, tokens, pages, len(tokens), slot, filled, saves)
        if not keep:
            self.release(node)
        return node

    def insert_cuts(self, tokens: list[int], pages: list[int], cuts: list[tuple[int, int, int | None]]) -> None:
        """`insert(tokens[:pos], pages, None, keep=False, filled=index, saves=saves)` for each (pos, index,
        saves) of cuts (one row's snapshots, ascending pos), walking the row's path once: each cut's
        pages are inserted from where the cut before it ended, then its snapshot added, so each default
        `saves` counts from the snapshot before it as it would one insert after another."""
        ps, node, done = self.page_size, self.root, 0
        for pos, filled, saves in cuts:
            whole = pos // ps * ps
            node = self._insert_pages(tokens, pages, node, done, whole)
            done = whole
            self._snapshot_at(node, tokens, pages, pos, None, filled, saves)
        self.lock(node)
        self.release(node)

    def _snapshot_at(self, node: Node, tokens: list[int], pages: list[int], pos: int, slot: int | None,
                     filled: int | None, saves: int | None) -> None:
        """The snapshot of the state after tokens[:pos] (copied from `slot`, or already in `filled`) on
        `node`, which ends at pos's last whole page; `filled` goes back when there is nothing to keep."""
        if not self.stateful or pos == 0:
            if filled is not None:
                self.allocator.free_snapshot(filled)
            return
        whole = pos // self.page_size * self.page_size
        tail = tuple(tokens[whole:pos])
        if saves is None:
            saves = pos - self._deepest_snapshot_above(node, tokens[:pos])
        self._add_snapshot(node, pos, tail, pages[whole // self.page_size] if tail else None, slot, filled, saves)

    def release(self, node: Node) -> None:
        """Undo one `lock` and drop what nobody can use any more."""
        self.unlock(node)
        self._prune(node)

    def _insert_pages(self, tokens: list[int], pages: list[int], node: Node | None = None, pos: int = 0,
                      end: int | None = None) -> Node:
        """The node (its end == end, default len(tokens)) of the path of tokens[:end] with the KV in pages,
        whose first `pos` tokens are already the path down to `node` (default: from the root)."""
        ps, now = self.page_size, next(self._clock)
        node = self.root if node is None else node
        end = len(tokens) if end is None else end
        node.last_used = now
        while pos < end:
            first = tuple(tokens[pos:pos + ps])
            child = node.children.get(first)
            if child is None:
                for page in pages[pos // ps:end // ps]:
                    self.allocator.ref_page(page)
                child = Node(key=tuple(tokens[pos:end]), pages=list(pages[pos // ps:end // ps]), start=pos,
                             parent=node, last_used=now)
                node.children[first] = child
                return child
            k = _common_pages(child.key, tokens, pos, ps, end)
            if k * ps < len(child.key):
                child = self._split(child, k)
            child.last_used = now
            pos, node = pos + len(child.key), child
        return node

    def _split(self, node: Node, k: int) -> Node:
        """Cut node after its first k pages; returns the new upper part (which keeps node's lock)."""
        ps = self.page_size
        upper = Node(key=node.key[:k * ps], pages=node.pages[:k], start=node.start, parent=node.parent,
                     lock=node.lock, last_used=node.last_used)
        upper.parent.children[node.key[:ps]] = upper
        node.key, node.pages, node.start, node.parent = node.key[k * ps:], node.pages[k:], upper.end, upper
        upper.children[node.key[:ps]] = node
        keep = [s for s in node.snapshots if s.pos - len(s.tail) > upper.end]
        upper.snapshots = [s for s in node.snapshots if s.pos - len(s.tail) <= upper.end]
        node.snapshots = keep
        for snap in upper.snapshots:
            snap.node = upper
        return upper

    def _deepest_snapshot_above(self, node: Node, tokens: list[int]) -> int:
        """Position of the deepest snapshot before len(tokens) on the path of `tokens` (which ends in
        `node` or in its last partial page), 0 if none."""
        pos, best = len(tokens), 0
        n = node
        while n is not None:
            for s in n.snapshots:
                floor = s.pos - len(s.tail)
                if best < s.pos < pos and tuple(tokens[floor:s.pos]) == s.tail:
                    best = s.pos
            n = n.parent
        return best

    @staticmethod
    def _path_tokens(snap: Snapshot) -> list[int]:
        """The tokens before snap.pos: the keys from the root down to its node, then its tail."""
        keys, n = [], snap.node
        while n is not None:
            keys.append(n.key)
            n = n.parent
        path = [t for key in reversed(keys) for t in key]
        return path[:snap.pos - len(snap.tail)] + list(snap.tail)

    def _add_snapshot(self, node: Node, pos: int, tail: tuple[int, ...], tail_page: int | None, slot: int | None,
                      filled: int | None, saves: int) -> None:
        now = next(self._clock)
        for snap in node.snapshots:
            if snap.pos == pos and snap.tail == tail:
                snap.last_used, snap.saves = now, saves
                snap.priority = self._inflation + snap.uses * snap.saves
                self._order.rank(snap)
                if filled is not None:
                    self.allocator.free_snapshot(filled)
                return
        index = filled if filled is not None else self.take_snapshot_slot(saves)
        if index is None:
            return  # the pool is full of snapshots worth more than this one
        if filled is None:
            self.state_pool.copy_slot(slot, index)
        if tail_page is not None:
            self.allocator.ref_page(tail_page)
        snap = Snapshot(pos=pos, index=index, tail=tail, tail_page=tail_page, node=node, last_used=now,
                        saves=saves, priority=self._inflation + saves, born=next(self._born))
        node.snapshots.append(snap)
        self._snapshots[snap] = None
        self._order.rank(snap)
        self.snapshots_taken += 1

    def take_snapshot_slot(self, saves: int | None = None) -> int | None:
        """A free snapshot slot, or None. When none is free, the lowest-priority snapshot is evicted,
        unless a snapshot saving `saves` tokens would rank below it (then None)."""
        cheapest = self._order.cheapest() if self.allocator.num_free_snapshots == 0 and self.stateful else None
        if cheapest is not None:
            if saves is not None and cheapest.priority > self._inflation + saves:
                return None
            self._evict_snapshot(cheapest)
        return self.allocator.alloc_snapshot()

    # ---- eviction ----------------------------------------------------------------------------------
    def evict_pages(self, num_free: int) -> bool:
        """Evict unlocked leaves, least recently used first, then snapshots holding a tail page (also on
        locked paths), lowest priority first, until the allocator has num_free free pages. Returns
        whether it has."""
        while self.allocator.num_free_pages < num_free:
            leaves = sorted(self._evictable_leaves(), key=_leaf_age)
            for leaf in leaves:
                self._evict_node(leaf)
                if self.allocator.num_free_pages >= num_free:
                    break
            if leaves:
                continue
            tails = [s for s in self._snapshots if s.tail_page is not None and not s.pins]
            if not tails:
                return False
            self._evict_snapshot(min(tails, key=eviction_key))
        return True

    def evict_snapshots(self, num_free: int) -> bool:
        """Evict snapshots, lowest priority first, until num_free snapshot slots are free."""
        while self.allocator.num_free_snapshots < num_free:
            cheapest = self._order.cheapest()
            if cheapest is None:
                return False
            self._evict_snapshot(cheapest)
        return True

    def _evict_snapshot(self, snap: Snapshot) -> None:
        self._inflation = max(self._inflation, snap.priority)
        node = snap.node
        self._drop_snapshot(node, snap)
        self._prune(node)

    def _drop_snapshot(self, node: Node, snap: Snapshot) -> None:
        node.snapshots.remove(snap)
        del self._snapshots[snap]
        self.allocator.free_snapshot(snap.index)
        if snap.tail_page is not None:
            self.allocator.unref_page(snap.tail_page)

    def _evict_node(self, node: Node) -> None:
        for snap in list(node.snapshots):
            self._drop_snapshot(node, snap)
        for page in node.pages:
            self.allocator.unref_page(page)
        parent = node.parent
        del parent.children[node.key[:self.page_size]]
        self._prune(parent)

    def _prune(self, node: Node) -> None:
        """A hybrid model cannot use pages without a snapshot at or below them: drop such leaves."""
        while (self.stateful and node is not self.root and not node.children and not node.snapshots
               and node.lock == 0):
            parent = node.parent
            for page in node.pages:
                self.allocator.unref_page(page)
            del parent.children[node.key[:self.page_size]]
            node = parent

    def _evictable_leaves(self) -> list[Node]:
        return [n for n in self._nodes() if not n.children and n.lock == 0 and n is not self.root]

    def flush(self) -> None:
        """Drop everything (only when no request holds a lock)."""
        assert self.root.lock == 0, "flush while requests use the cache"
        for snap in list(self.root.snapshots):
            self._drop_snapshot(self.root, snap)
        while self.root.children:
            for leaf in self._evictable_leaves():
                self._evict_node(leaf)

    # ---- reports -----------------------------------------------------------------------------------
    def _nodes(self) -> list[Node]:
        out, stack = [], [self.root]
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out

    def held_pages(self) -> list[int]:
        """One entry per page reference the cache holds (for the allocator's integrity check)."""
        out = []
        for n in self._nodes():
            out.extend(n.pages)
            out.extend(s.tail_page for s in n.snapshots if s.tail_page is not None)
        return out

    def held_snapshots(self) -> list[int]:
        return [s.index for n in self._nodes() for s in n.snapshots]

    def stats(self) -> dict:
        """cached_pages: pages the cache references (node pages and snapshot tail pages);
        evictable_pages: those of them only unlocked nodes reference, freed by evicting them."""
        nodes = self._nodes()
        cached: set[int] = set()
        refs: dict[int, int] = {}
        for n in nodes:
            held = n.pages + [s.tail_page for s in n.snapshots if s.tail_page is not None]
            cached.update(held)
            if n.lock == 0:
                for p in held:
                    refs[p] = refs.get(p, 0) + 1
        evictable = sum(1 for p, r in refs.items() if self.allocator.page_refs[p] == r)
        return {"cached_pages": len(cached), "evictable_pages": evictable,
                "num_snapshots": len(self._snapshots), "snapshot_slots": self.allocator.num_snapshots,
                "snapshot_bytes": len(self._snapshots) * (self.state_pool.slot_bytes if self.stateful else 0),
                "snapshots_taken": self.snapshots_taken, "snapshots_hit": self.snapshots_hit,
                "cache_nodes": len(nodes) - 1,
                "cache_hit_tokens": self.hit_tokens, "cache_lookup_tokens": self.lookup_tokens}

    def check_integrity(self) -> None:
        """Tree shape, page alignment, locks equal to the sum of the children's plus own users (checked
        by the caller through `lock` counts >= children's), snapshots inside their node's range."""
        ps = self.page_size
        nodes = self._nodes()
        assert len(self._snapshots) == sum(len(n.snapshots) for n in nodes), "the snapshot list and the tree disagree"
        self._order.check_integrity()
        for n in nodes:
            if n is self.root:
                assert not n.key and not n.pages and n.start == 0, "root holds tokens"
            else:
                assert len(n.key) > 0 and len(n.key) % ps == 0, f"node key of {len(n.key)} tokens is not whole pages"
                assert len(n.pages) == len(n.key) // ps, "node pages do not cover its key"
                assert n.start == n.parent.end, "node does not start where its parent ends"
                assert n.parent.children.get(n.key[:ps]) is n, "node is not its parent's child under its key"
                assert not self.stateful or n.children or n.snapshots or n.lock > 0, (
                    "a leaf without snapshots is kept in a hybrid model's cache")
            assert n.lock >= sum(c.lock for c in n.children.values()), "a node's lock is below its children's"
            for s in n.snapshots:
                assert s.node is n and s in self._snapshots, "snapshot's node or list entry is stale"
                assert s.pins == 0, "a snapshot is still pinned between steps (matched, never restored)"
                floor = s.pos - len(s.tail)
                assert floor % ps == 0 and len(s.tail) < ps, "snapshot tail is not the partial page"
                assert (n is self.root and floor == 0) or n.start < floor <= n.end, "snapshot outside its node"
                assert (s.tail_page is None) == (len(s.tail) == 0), "tail page without tail (or the reverse)"


def _common_pages(key: tuple[int, ...], tokens: list[int], pos: int, ps: int, end: int | None = None) -> int:
    """How many whole pages of key equal tokens[pos:end]."""
    n = min(len(key), (len(tokens) if end is None else end) - pos) // ps
    if tuple(tokens[pos:pos + n * ps]) == key[:n * ps]:
        return n
    lo, hi = 0, n  # key[:lo*ps] matches, key[:hi*ps] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tuple(tokens[pos:pos + mid * ps]) == key[:mid * ps]:
            lo = mid
        else:
            hi = mid
    return lo


def _leaf_age(node: Node) -> int:
    return max([node.last_used] + [s.last_used for s in node.snapshots])


__all__ = ["Match", "Node", "OutOfPages", "PrefixCache", "Snapshot"]
