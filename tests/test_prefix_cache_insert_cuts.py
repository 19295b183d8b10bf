"""PrefixCache.insert_cuts (a prompt chunk's snapshots in one walk of the tree) builds the same tree,
snapshots, worths and page references as one insert after another, on an empty cache and on one that
already holds part of the path or all of it and more (nodes to split, a snapshot above, a cut at a page boundary, a cut
before the first page)."""

import pytest
import torch

from hybrid_sgl.memory.allocator import Allocator
from hybrid_sgl.memory.kv_pool import KVPool
from hybrid_sgl.memory.prefix_cache import PrefixCache
from hybrid_sgl.memory.state_pool import StatePool

PAGE = 4


def _cache() -> PrefixCache:
    a = Allocator(num_slots=3, num_pages=64, page_size=PAGE, max_pages_per_request=32, device="cpu",
                  num_snapshots=16)
    state = StatePool(num_layers=1, num_slots=3, conv_shape=(1, 1), conv_dtype=torch.float32, ssm_shape=(2,),
                      ssm_dtype=torch.float32, device="cpu", num_snapshots=16)
    kv = KVPool(num_layers=1, num_pages=64, page_size=PAGE, num_kv_heads=1, head_dim=1, dtype=torch.float32,
                device="cpu")
    return PrefixCache(allocator=a, state_pool=state, kv_pool=kv)


def _shape(cache: PrefixCache) -> list:
    nodes = sorted(cache._nodes(), key=lambda n: (n.start, n.key))
    return [(n.start, n.key, n.pages, n.lock, sorted((s.pos, s.tail, s.tail_page, s.saves, s.priority, s.uses)
                                                     for s in n.snapshots)) for n in nodes]


def _state(cache: PrefixCache) -> tuple:
    a = cache.allocator
    return _shape(cache), list(a.page_refs), sorted(a.free_snapshots), cache.snapshots_taken


def _fill(cache: PrefixCache, tokens: list[int], pre: list[int] | None, cuts: list[tuple[int, int | None]],
          one_walk: bool) -> tuple:
    """A slot holding `tokens`; `pre` cached first (a finished request's prefix); then the cuts (pos,
    saves) as one walk or one insert each. Returns the cache's state with the slot freed."""
    a = cache.allocator
    if pre is not None:
        slot = a.alloc_slot()
        a.grow(slot, len(pre))
        cache.insert(pre, a.slot_pages[slot], slot, keep=False)
        a.free_slot(slot)
    slot = a.alloc_slot()
    a.grow(slot, len(tokens))
    taken = [(pos, a.alloc_snapshot(), saves) for pos, saves in cuts]
    if one_walk:
        cache.insert_cuts(tokens, a.slot_pages[slot], taken)
    else:
        for pos, index, saves in taken:
            cache.insert(tokens[:pos], a.slot_pages[slot], None, keep=False, filled=index, saves=saves)
    a.free_slot(slot)
    cache.check_integrity()
    a.check_integrity(cache.held_pages(), cache.held_snapshots())
    return _state(cache)


@pytest.mark.parametrize("pre", [None, list(range(100, 110)), list(range(100, 113)) + [7, 7, 7], list(range(100, 121))])
@pytest.mark.parametrize("cuts", [[(5, None), (8, None), (14, 3), (21, None)], [(2, None)], [(3, None), (12, 4)]])
def test_one_walk_equals_one_insert_after_another(pre, cuts):
    tokens = list(range(100, 123))
    assert _fill(_cache(), tokens, pre, cuts, one_walk=True) == _fill(_cache(), tokens, pre, cuts, one_walk=False)
