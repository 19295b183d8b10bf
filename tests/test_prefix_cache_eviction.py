"""Snapshot eviction by value: a full snapshot pool gives up the snapshot that saves the fewest
tokens over the one above it (weighted by its uses), not the least recently used; a new snapshot
worth less than every one held is not taken; one that stops being used still ages out. The
cache's page counts: evictable pages are a part of cached pages."""

import torch

from hybrid_sgl.memory.allocator import Allocator
from hybrid_sgl.memory.kv_pool import KVPool
from hybrid_sgl.memory.prefix_cache import PrefixCache
from hybrid_sgl.memory.state_pool import StatePool

PAGE = 4


def _cache(num_snapshots: int) -> PrefixCache:
    a = Allocator(num_slots=2, num_pages=64, page_size=PAGE, max_pages_per_request=32, device="cpu",
                  num_snapshots=num_snapshots)
    state = StatePool(num_layers=1, num_slots=2, conv_shape=(1, 1), conv_dtype=torch.float32, ssm_shape=(2,),
                      ssm_dtype=torch.float32, device="cpu", num_snapshots=num_snapshots)
    kv = KVPool(num_layers=1, num_pages=64, page_size=PAGE, num_kv_heads=1, head_dim=1, dtype=torch.float32,
                device="cpu")
    return PrefixCache(allocator=a, state_pool=state, kv_pool=kv)


def _snapshot(cache: PrefixCache, tokens: list[int]) -> None:
    """Cache tokens with a snapshot at their end, as a request finishing there would."""
    a = cache.allocator
    slot = a.alloc_slot()
    a.grow(slot, len(tokens))
    cache.insert(tokens, a.slot_pages[slot], slot, keep=False)
    a.free_slot(slot)


def _positions(cache: PrefixCache) -> list[int]:
    return sorted(s.pos for n in cache._nodes() for s in n.snapshots)


def test_the_snapshot_saving_least_goes_first_and_a_worthless_one_is_not_taken():
    cache = _cache(num_snapshots=2)
    stem = list(range(1, 41))
    _snapshot(cache, stem[:8])  # saves 8
    _snapshot(cache, stem[:12])  # saves 4 over the one at 8: the least worth, though the newest
    _snapshot(cache, [50] * 40)  # saves 40
    assert _positions(cache) == [8, 40]
    assert cache.take_snapshot_slot(saves=2) is None  # worth less than all held
    assert cache.stats()["snapshots_taken"] == 3
    cache.check_integrity()
    cache.allocator.check_integrity(cache_pages=cache.held_pages(), cache_snapshots=cache.held_snapshots())


def test_a_snapshot_in_use_outlives_a_deeper_one_nobody_uses_and_unused_ones_age_out():
    cache = _cache(num_snapshots=2)
    hot = [7] * 16
    _snapshot(cache, hot)  # saves 16
    for _ in range(4):  # restored four times: priority 5 * 16
        m = cache.match(hot + [1], limit=16)
        assert m.pos == 16
        cache.lock(m.node)
        slot = cache.allocator.alloc_slot()
        cache.restore(m, slot)
        cache.allocator.free_slot(slot)
        cache.release(m.node)
    _snapshot(cache, [9] * 24)  # saves 24, never used
    _snapshot(cache, [8] * 28)  # saves 28: evicts the unused 24, not the hot 16
    assert _positions(cache) == [16, 28]
    assert cache.stats()["snapshots_hit"] == 4
    for k in range(12):  # a stream of new prefixes: each eviction raises the floor, until the hot one goes
        _snapshot(cache, [10 + k] * 36)
    assert 16 not in _positions(cache)
    cache.check_integrity()


def _restore(cache: PrefixCache, tokens: list[int]) -> int:
    """Admit a request for tokens as the scheduler would (match, lock, restore, free); returns the hit."""
    m = cache.match(tokens, limit=len(tokens) - 1)
    cache.lock(m.node)
    slot = cache.allocator.alloc_slot()
    cache.restore(m, slot)
    cache.allocator.free_slot(slot)
    cache.release(m.node)
    return m.pos


def test_a_snapshot_whose_neighbour_above_went_is_worth_its_whole_reach_at_its_next_use():
    cache = _cache(num_snapshots=2)
    stem = list(range(1, 41))
    _snapshot(cache, stem[:32])  # saves 32
    _snapshot(cache, stem[:36])  # saves 4 over the one at 32
    deep = next(s for n in cache._nodes() for s in n.snapshots if s.pos == 36)
    assert deep.saves == 4
    cache._evict_snapshot(next(s for n in cache._nodes() for s in n.snapshots if s.pos == 32))
    assert _restore(cache, stem[:36] + [99]) == 36
    assert deep.saves == 36  # nothing above it any more: it now saves all 36 tokens
    _snapshot(cache, [60] * 24)  # saves 24, never used
    _snapshot(cache, [61] * 28)  # the pool is full: the unused 24 goes, not the one at 36 (used twice, 36 each)
    assert _positions(cache) == [28, 36]
    cache.check_integrity()
    cache.allocator.check_integrity(cache_pages=cache.held_pages(), cache_snapshots=cache.held_snapshots())


def test_evictable_pages_are_part_of_the_cached_pages():
    cache = _cache(num_snapshots=4)
    _snapshot(cache, list(range(1, 11)))  # 10 tokens: two whole pages and a snapshot tail page
    stats = cache.stats()
    assert stats["cached_pages"] == 3 and stats["evictable_pages"] == 3
    assert stats["snapshot_bytes"] == cache.state_pool.slot_bytes


def test_tail_pages_of_snapshots_on_a_locked_path_can_be_evicted_but_not_a_pinned_one():
    """Snapshots inside pages pin a tail page each; when the path they hang on is locked (an admission
    reuses it) and no leaf is left, evicting them is the only way to free pages. The snapshot the
    admission restores stays until it is restored."""
    cache = _cache(num_snapshots=8)
    stem = list(range(1, 33))
    for pos in (6, 10, 13, 18, 31):  # five tail pages on the path of stem
        _snapshot(cache, stem[:pos])
    m = cache.match(stem + [99], limit=32)
    assert m.pos == 31
    cache.lock(m.node)
    cache.pin(m, +1)
    a = cache.allocator
    taken = [a.alloc_page() for _ in range(a.num_free_pages)]  # everything else is in use
    assert cache.evict_pages(4)
    assert 31 in _positions(cache) and len(_positions(cache)) == 1
    assert not cache.evict_pages(5)  # the pinned snapshot's tail page and the locked path's pages stay
    cache.pin(m, -1)
    cache.release(m.node)
    for page in taken:
        a.unref_page(page)
    cache.check_integrity()
    a.check_integrity(cache_pages=cache.held_pages(), cache_snapshots=cache.held_snapshots())


def test_the_eviction_heap_picks_what_a_scan_of_every_snapshot_would():
    """Random inserts, restores, pins and evictions over a small snapshot pool: at every turn the heap's
    cheapest unpinned snapshot is the minimum of a scan over all of them (priority, last use, age), and the
    cache's integrity check (which covers the heap) holds."""
    import random

    from hybrid_sgl.memory.eviction_order import eviction_key

    rng = random.Random(0)
    cache = _cache(num_snapshots=6)
    prompts = [[rng.randrange(1, 5) for _ in range(rng.randrange(5, 30))] for _ in range(40)]
    pinned = []
    for turn in range(300):
        tokens = rng.choice(prompts)
        action = rng.random()
        if action < 0.5:
            _snapshot(cache, tokens)
        elif action < 0.8:
            _restore(cache, tokens + [9])
        elif action < 0.9 and not pinned:
            m = cache.match(tokens + [9], limit=len(tokens))
            if m.snapshot is not None:
                cache.lock(m.node)
                cache.pin(m, +1)
                pinned.append(m)
        elif pinned:
            m = pinned.pop()
            cache.pin(m, -1)
            cache.release(m.node)
        held = [s for s in cache._snapshots if not s.pins]
        expected = min(held, key=eviction_key) if held else None
        assert cache._order.cheapest() is expected, turn
        if not pinned:
            cache.check_integrity()
    assert cache.stats()["snapshots_taken"] > 20 and cache.stats()["snapshots_hit"] > 10
