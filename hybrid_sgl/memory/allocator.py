"""One allocator for the three pools: state slots (one per running request), KV pages and
snapshot slots (recurrent state copies kept by the prefix cache).

A running request owns one slot; its page table is row `slot` of `page_table`
(`[num_slots + 1, max_pages_per_request]`, int32, on the device), so a batch's block table
is one gather by slot. Pages carry reference counts: a page is shared by every request whose
page table holds it and by the prefix cache (`ref_page` / `unref_page`). Snapshot slots are
indices into the state pool past its pad slot (`num_slots + 1 ...`), handed to the prefix cache.
"""

import torch


class OutOfPages(Exception):
    pass


class Allocator:
    def __init__(self, *, num_slots: int, num_pages: int, page_size: int, max_pages_per_request: int,
                 device: torch.device | str, num_snapshots: int = 0, draft_rows_per_slot: int = 0):
        self.num_slots = num_slots
        self.num_snapshots = num_snapshots
        self.draft_rows_per_slot = draft_rows_per_slot
        first_snapshot = num_slots + 1  # state-pool index of snapshot 0 (after the pad slot)
        self.free_snapshots = list(range(first_snapshot + num_snapshots - 1, first_snapshot - 1, -1))
        self.num_pages = num_pages
        self.page_size = page_size
        self.pad_slot = num_slots
        self.pad_page = num_pages
        self.max_pages_per_request = max_pages_per_request
        self.free_slots = list(range(num_slots - 1, -1, -1))
        self.free_pages = list(range(num_pages - 1, -1, -1))
        self.page_refs = [0] * num_pages
        self.slot_pages: list[list[int] | None] = [None] * num_slots  # None = slot free
        self.page_table = torch.full((num_slots + 1, max_pages_per_request), num_pages,
                                     dtype=torch.int32, device=device)

    # ---- queries -------------------------------------------------------------------------------
    @property
    def num_free_slots(self) -> int:
        return len(self.free_slots)

    @property
    def num_free_pages(self) -> int:
        return len(self.free_pages)

    @property
    def num_free_snapshots(self) -> int:
        return len(self.free_snapshots)

    def pages_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.page_size)

    def extra_pages_needed(self, slot: int, num_tokens: int) -> int:
        """Pages the slot still needs so that `num_tokens` tokens fit."""
        return max(0, self.pages_for(num_tokens) - len(self.slot_pages[slot]))

    # ---- slots ---------------------------------------------------------------------------------
    def alloc_slot(self) -> int | None:
        if not self.free_slots:
            return None
        slot = self.free_slots.pop()
        self.slot_pages[slot] = []
        return slot

    def free_slot(self, slot: int) -> None:
        """Release the slot and drop its references on its pages."""
        pages = self.slot_pages[slot]
        if pages is None:
            raise RuntimeError(f"double free of state slot {slot}")
        for page in pages:
            self._unref(page)
        self.slot_pages[slot] = None
        self.page_table[slot].fill_(self.pad_page)
        self.free_slots.append(slot)

    def draft_rows(self, slot: int) -> list[int]:
        """The state-pool rows that hold slot's state after each verified token (speculative decoding):
        fixed per slot, after the snapshots."""
        first = self.num_slots + 1 + self.num_snapshots + slot * self.draft_rows_per_slot
        return list(range(first, first + self.draft_rows_per_slot))

    # ---- snapshot slots ------------------------------------------------------------------------
    def alloc_snapshot(self) -> int | None:
        return self.free_snapshots.pop() if self.free_snapshots else None

    def free_snapshot(self, index: int) -> None:
        self.free_snapshots.append(index)

    # ---- pages ---------------------------------------------------------------------------------
    def attach(self, slot: int, pages: list[int]) -> None:
        """Give an empty slot shared references to `pages` (a cached prefix), in order."""
        assert self.slot_pages[slot] == [], f"slot {slot} already has pages"
        if len(pages) > self.max_pages_per_request:
            raise ValueError(f"{len(pages)} pages exceed the per-request limit of {self.max_pages_per_request}")
        for page in pages:
            self.ref_page(page)
        self.slot_pages[slot] = list(pages)
        if pages:
            self._write_pages(slot, 0, pages)

    def alloc_page(self) -> int:
        """One page with a single reference held by the caller; raises OutOfPages."""
        if not self.free_pages:
            raise OutOfPages("need 1 page, 0 free")
        page = self.free_pages.pop()
        self.page_refs[page] = 1
        return page

    def ref_page(self, page: int) -> None:
        assert self.page_refs[page] > 0, f"page {page} is free; it cannot be shared"
        self.page_refs[page] += 1

    def unref_page(self, page: int) -> None:
        self._unref(page)

    def grow(self, slot: int, num_tokens: int) -> None:
        """Give the slot enough pages for `num_tokens` tokens, or raise OutOfPages (no change)."""
        need = self.extra_pages_needed(slot, num_tokens)
        if need == 0:
            return
        pages = self.slot_pages[slot]
        if len(pages) + need > self.max_pages_per_request:
            raise ValueError(f"{num_tokens} tokens exceed the per-request limit of "
                             f"{self.max_pages_per_request * self.page_size}")
        if need > len(self.free_pages):
            raise OutOfPages(f"need {need} pages, {len(self.free_pages)} free")
        new = [self.free_pages.pop() for _ in range(need)]
        for page in new:
            self.page_refs[page] = 1
        start = len(pages)
        pages.extend(new)
        self._write_pages(slot, start, new)

    def _write_pages(self, slot: int, start: int, pages: list[int]) -> None:
        """page_table[slot, start:start + len(pages)] = pages, queued on the stream: a blocking copy would wait
        for the step in flight, behind which the overlapped decode grows the next step's pages. From pageable
        memory (CUDA stages it at once, with no device wait): a pinned tensor a call would cost an allocation
        of pinned memory while the last ones still wait for their copies."""
        values = torch.tensor(pages, dtype=torch.int32)
        self.page_table[slot, start:start + len(pages)].copy_(values, non_blocking=True)

    def _unref(self, page: int) -> None:
        self.page_refs[page] -= 1
        if self.page_refs[page] < 0:
            raise RuntimeError(f"page {page} released more often than taken")
        if self.page_refs[page] == 0:
            self.free_pages.append(page)

    # ---- integrity -----------------------------------------------------------------------------
    def check_integrity(self, cache_pages: list[int] = (), cache_snapshots: list[int] = ()) -> None:
        """Every slot is free xor owned; every page's refcount equals its owners (page tables plus
        `cache_pages`, one entry per reference the prefix cache holds); every snapshot slot is free
        xor in `cache_snapshots`; the device page table mirrors the host lists. Raises
        AssertionError on the first violation."""
        free_slots = set(self.free_slots)
        assert len(free_slots) == len(self.free_slots), "a slot is on the free list twice"
        for slot in range(self.num_slots):
            owned = self.slot_pages[slot] is not None
            assert owned != (slot in free_slots), f"slot {slot} is both/neither free and owned"
        refs = [0] * self.num_pages
        table = self.page_table.cpu()
        for slot, pages in enumerate(self.slot_pages):
            row = table[slot].tolist()
            if pages is None:
                assert all(p == self.pad_page for p in row), f"free slot {slot} has a page table"
                continue
            assert row[: len(pages)] == pages, f"slot {slot}: device page table differs from host"
            assert all(p == self.pad_page for p in row[len(pages):]), f"slot {slot}: stale pages"
            for page in pages:
                refs[page] += 1
        assert all(p == self.pad_page for p in table[self.pad_slot].tolist()), "pad slot has pages"
        for page in cache_pages:
            refs[page] += 1
        held, free_snaps = list(cache_snapshots), set(self.free_snapshots)
        assert len(free_snaps) == len(self.free_snapshots), "a snapshot slot is on the free list twice"
        assert len(set(held)) == len(held), "a snapshot slot is held twice by the prefix cache"
        assert not free_snaps & set(held), "a snapshot slot is both free and held"
        assert len(free_snaps) + len(held) == self.num_snapshots, (
            f"snapshot slots leaked: {len(free_snaps)} free + {len(held)} held of {self.num_snapshots}")
        free_pages = set(self.free_pages)
        assert len(free_pages) == len(self.free_pages), "a page is on the free list twice"
        for page in range(self.num_pages):
            assert refs[page] == self.page_refs[page], (
                f"page {page}: refcount {self.page_refs[page]} but {refs[page]} owners")
            assert (refs[page] == 0) == (page in free_pages), f"page {page}: free list disagrees"
