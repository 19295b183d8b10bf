"""Allocator invariants under random alloc / grow / free sequences."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_sgl.memory.allocator import Allocator, OutOfPages


def make(num_slots=4, num_pages=12, page_size=4, max_pages=6):
    return Allocator(num_slots=num_slots, num_pages=num_pages, page_size=page_size,
                     max_pages_per_request=max_pages, device="cpu")


ops = st.lists(st.tuples(st.sampled_from(["alloc", "grow", "free"]), st.integers(0, 30)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_random_sequences_never_leak_or_double_allocate(sequence):
    a = make()
    owned: dict[int, int] = {}  # slot -> tokens covered
    for op, arg in sequence:
        if op == "alloc":
            slot = a.alloc_slot()
            if slot is None:
                assert len(owned) == a.num_slots
            else:
                assert slot not in owned
                owned[slot] = 0
        elif op == "grow" and owned:
            slot = sorted(owned)[arg % len(owned)]
            free_before = a.num_free_pages
            try:
                a.grow(slot, arg)
                owned[slot] = max(owned[slot], arg)
            except OutOfPages:
                assert a.num_free_pages == free_before  # no partial allocation
            except ValueError:
                assert arg > a.max_pages_per_request * a.page_size
        elif op == "free" and owned:
            slot = sorted(owned)[arg % len(owned)]
            a.free_slot(slot)
            del owned[slot]
        a.check_integrity()
        used = sum(a.pages_for(t) for t in owned.values())
        assert a.num_free_pages == a.num_pages - used
        assert a.num_free_slots == a.num_slots - len(owned)
    for slot in list(owned):
        a.free_slot(slot)
    a.check_integrity()
    assert a.num_free_pages == a.num_pages and a.num_free_slots == a.num_slots


def test_double_free_raises_and_integrity_catches_corruption():
    a = make()
    slot = a.alloc_slot()
    a.grow(slot, 9)
    assert a.page_table[slot, :3].tolist() == a.slot_pages[slot]
    a.free_slot(slot)
    with pytest.raises(RuntimeError, match="double free"):
        a.free_slot(slot)
    slot = a.alloc_slot()
    a.grow(slot, 4)
    a.page_table[slot, 0] = (a.slot_pages[slot][0] + 1) % a.num_pages  # corrupt the device mirror
    with pytest.raises(AssertionError, match="differs"):
        a.check_integrity()


def test_pad_slot_and_pad_page_are_never_handed_out():
    a = make(num_slots=2, num_pages=3, page_size=2, max_pages=3)
    slots = [a.alloc_slot(), a.alloc_slot()]
    assert a.alloc_slot() is None and a.pad_slot not in slots
    a.grow(slots[0], 6)
    assert a.pad_page not in a.slot_pages[slots[0]]
    with pytest.raises(OutOfPages):
        a.grow(slots[1], 1)
