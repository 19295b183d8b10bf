"""The one step-input builder: StepPlan -> ForwardBatch, for eager steps, CUDA-graph replays and
tensor-parallel followers alike.

The host writes a plan into one flat int64 buffer (pinned on CUDA; two in turn, since a launched
step's copy may still wait in the stream while the host fills the next) and copies it to a static
device buffer with one copy. A host buffer is written again only once its last copy has run (an
event per turn), so the host may run any number of steps ahead of the device. Everything else is
derived on the device from that buffer, with no host sync, so a captured graph can hold the
derivation and replay it for the next plan of the same shape. Layout for a shape of T tokens and B
rows (padded shapes included):

    ids [T] | positions [T] | prev_row [T] | row [T] | slots [B] | prefix_lens [B] | cu_seqlens [B + 1]
    | snap_pos [B * C] | snap_slots [B * C]

with C = MAX_CUTS snapshot cuts a row (run-relative token counts and state-pool rows, -1 for none).

Padding (a plan smaller than its shape): the pad tokens belong to pad rows, pad token k to row
B_plan + min(k, pad rows - 1), each with the pad slot, prefix 0 and no KV store, so they touch no
request's state or KV; their attention reads the pad page (zeros) and stays finite.
"""

from __future__ import annotations

import numpy as np
import torch

from hybrid_sgl.batch import MAX_CUTS, ForwardBatch, ForwardMode, StepPlan, device_index

NUM_BUILDS = [0]  # host builds so far (tests count them per step)


def layout_size(num_tokens: int, num_rows: int) -> int:
    return 4 * num_tokens + (3 + 2 * MAX_CUTS) * num_rows + 1


class StepInputs:
    def __init__(self, *, max_tokens: int, max_rows: int, page_table: torch.Tensor, page_size: int,
                 pad_slot: int, kv_pool, state_pool, device: torch.device):
        """page_table: the allocator's [slots + 1, max_pages] int32 table (read on the device)."""
        self.max_tokens, self.max_rows = max_tokens, max_rows
        self.page_table, self.page_size, self.pad_slot = page_table, page_size, pad_slot
        self.kv_pool, self.state_pool, self.device = kv_pool, state_pool, device
        size = layout_size(max_tokens, max_rows)
        self.host = torch.zeros((2, size), dtype=torch.int64, pin_memory=device.type == "cuda")
        self.host_view = self.host.numpy()
        self.turn = 0
        self.dev = torch.zeros(size, dtype=torch.int64, device=device)
        self.prev_ids = torch.zeros(max(max_rows, max_tokens, 1), dtype=torch.int64, device=device)
        self.rows_host = torch.zeros((2, max_tokens), dtype=torch.int64, pin_memory=device.type == "cuda")
        self.rows_dev = torch.zeros((2, max_tokens), dtype=torch.int64, device=device)
        self.rows_turn = 0
        # per turn of each host buffer: an event recorded after its last copy (CUDA only)
        on_gpu = device.type == "cuda"
        self.copied = [torch.cuda.Event() if on_gpu else None for _ in range(2)]
        self.rows_copied = [torch.cuda.Event() if on_gpu else None for _ in range(2)]

    def fits(self, num_tokens: int, num_rows: int) -> bool:
        return num_tokens <= self.max_tokens and num_rows <= self.max_rows

    # ---- host: one fill and one copy per step ----------------------------------------------------
    def fill(self, plan: StepPlan, num_tokens: int | None = None, num_rows: int | None = None,
             prev_ids: torch.Tensor | None = None) -> None:
        """Write `plan` padded to (num_tokens, num_rows) (default: its own shape) and queue the copy.
        prev_ids [>= max prev row + 1]: the previous step's sampled ids on the device (with
        plan.ids_on_device: [>= plan.num_tokens], the plan's ids)."""
        NUM_BUILDS[0] += 1
        b, t = plan.num_rows, plan.num_tokens
        T, B = num_tokens or t, num_rows or b
        assert t <= T and b <= B and (t == T or b < B), f"plan of {t} tokens, {b} rows in shape ({T}, {B})"
        assert self.fits(T, B), f"shape ({T}, {B}) exceeds the buffers ({self.max_tokens}, {self.max_rows})"
        self.turn ^= 1
        _wait(self.copied[self.turn])
        h = self.host_view[self.turn]
        ids, pos, prev, row = h[:T], h[T:2 * T], h[2 * T:3 * T], h[3 * T:4 * T]
        slots, prefix, cu, snap_pos, snap_slots = _split_rows(h, T, B)
        lens = np.fromiter((len(r) for r in plan.tokens), dtype=np.int64, count=b)
        if b < B:
            lens = np.concatenate([lens, _pad_lens(T - t, B - b)])
        cu[0] = 0
        np.cumsum(lens, out=cu[1:])
        slots[:b] = plan.slots
        slots[b:] = self.pad_slot
        prefix[:b] = plan.prefix_lens
        prefix[b:] = 0
        row[:] = np.repeat(np.arange(B, dtype=np.int64), lens)
        pos[:] = np.arange(T, dtype=np.int64) - cu[:-1][row] + prefix[row]
        ids[:t] = np.fromiter((x for r in plan.tokens for x in r), dtype=np.int64, count=t)
        ids[t:] = 0
        prev[:] = -1
        if plan.ids_on_device:
            prev[:t] = np.arange(t, dtype=np.int64)
        elif plan.prev_rows is not None:
            firsts = cu[:b][np.asarray(plan.prev_rows) >= 0]
            prev[firsts] = [j for j in plan.prev_rows if j >= 0]
        snap_pos[:] = -1
        snap_slots[:] = -1
        if plan.snapshots:
            for i, cuts in enumerate(plan.snapshots):
                assert len(cuts) <= MAX_CUTS, f"row {i} has {len(cuts)} snapshot cuts; at most {MAX_CUTS} fit"
                for c, (p, index) in enumerate(sorted(cuts)):
                    assert 0 < p - prefix[i] <= lens[i], f"snapshot position {p} is outside row {i}'s run"
                    snap_pos[i * MAX_CUTS + c] = p - prefix[i]
                    snap_slots[i * MAX_CUTS + c] = index
        n = layout_size(T, B)
        self.dev[:n].copy_(self.host[self.turn, :n], non_blocking=True)
        _record(self.copied[self.turn])
        if prev_ids is not None:
            self.prev_ids[: prev_ids.shape[0]].copy_(prev_ids)

    def logit_rows(self, rows: list[int]) -> torch.Tensor:
        """rows as a device index [len(rows)], through a pinned buffer (no pageable copy, no wait). The
        index stays valid until the next call but one."""
        n = len(rows)
        if n > self.max_tokens:
            return device_index(rows, self.device)
        self.rows_turn ^= 1
        turn = self.rows_turn
        _wait(self.rows_copied[turn])
        host = self.rows_host[turn, :n]
        host.numpy()[:] = rows
        out = self.rows_dev[turn, :n]
        out.copy_(host, non_blocking=True)
        _record(self.rows_copied[turn])
        return out

    # ---- device: the ForwardBatch of the last fill (capturable) --------------------------------------
    def batch(self, mode: ForwardMode, num_tokens: int, num_rows: int, *, max_pages: int | None = None,
              with_prev: bool = False, short_rows: bool = False, replay_recurrent: bool = False,
              slot_lens: torch.Tensor | None = None, shift: int = 0,
              slot_alive: torch.Tensor | None = None) -> ForwardBatch:
        """ForwardBatch of the shape (num_tokens, num_rows) from the device buffer; device ops only.
        max_pages: block-table width (None: the page table's, as graphs need). short_rows: every row
        that is not a pad row holds at most SHORT_ROW_TOKENS tokens (StepPlan.short_rows); replay_recurrent:
        ForwardBatch.replay_recurrent. slot_lens [slots + 1] int64 on the device: the plan's prefix_lens are
        offsets over each slot's length there, plus `shift` (pad rows keep prefix 0). slot_alive [slots + 1] bool
        on the device: the rows of slots marked False run as pad rows (no state, no KV)."""
        assert short_rows or not replay_recurrent, "a replayed verify step has short rows"
        T, B, d = num_tokens, num_rows, self.dev
        ids, positions, prev, row = d[:T], d[T:2 * T], d[2 * T:3 * T], d[3 * T:4 * T]
        slots, prefix, cu, snap_pos, snap_slots = _split_rows(d, T, B)
        real_rows = slots != self.pad_slot
        if slot_alive is not None:
            real_rows = real_rows & slot_alive[slots]
            slots = torch.where(real_rows, slots, self.pad_slot)
        if slot_lens is not None:
            add = torch.where(real_rows, slot_lens[slots] + shift, 0)
            prefix, positions = prefix + add, positions + add[row]
        if with_prev:
            ids = torch.where(prev >= 0, self.prev_ids[prev.clamp(min=0)], ids)
        table = self.page_table if max_pages is None else self.page_table[:, :max_pages]
        block_table = table.index_select(0, slots)
        page = block_table[row, positions // self.page_size].long()
        real = real_rows[row]
        slot_mapping = torch.where(real, page * self.page_size + positions % self.page_size, -1)
        lens = cu[1:] - cu[:-1]
        cuts = {}
        if mode is ForwardMode.EXTEND and self.state_pool is not None:
            snap_slots = snap_slots.view(B, MAX_CUTS)
            if slot_alive is not None:
                snap_slots = torch.where(real_rows[:, None], snap_slots, -1)
            cuts = dict(snap_pos=snap_pos.view(B, MAX_CUTS).int(), snap_slots=snap_slots.int())
        return ForwardBatch(mode=mode, input_ids=ids, positions=positions, seq_lens=(prefix + lens).int(),
                            state_slots=slots.int(), block_table=block_table, slot_mapping=slot_mapping,
                            cu_seqlens=cu.int(), has_initial_state=prefix > 0, kv_pool=self.kv_pool,
                            state_pool=self.state_pool, short_rows=short_rows, replay_recurrent=replay_recurrent,
                            **cuts)

    def eager_batch(self, plan: StepPlan, prev_ids: torch.Tensor | None = None) -> ForwardBatch:
        """fill + batch at the plan's own shape."""
        self.fill(plan, prev_ids=prev_ids)
        return self.batch(plan.mode, plan.num_tokens, plan.num_rows,
                          with_prev=plan.prev_rows is not None or plan.ids_on_device,
                          max_pages=-(-plan.max_seq_len // self.page_size), short_rows=plan.short_rows,
                          replay_recurrent=plan.replay_recurrent)


def _split_rows(buf, T: int, B: int):
    """The per-row parts of a layout of (T, B): slots [B], prefix_lens [B], cu_seqlens [B + 1],
    snap_pos [B * C], snap_slots [B * C]."""
    o, C = 4 * T, MAX_CUTS
    return (buf[o:o + B], buf[o + B:o + 2 * B], buf[o + 2 * B:o + 3 * B + 1], buf[o + 3 * B + 1:o + (3 + C) * B + 1],
            buf[o + (3 + C) * B + 1:o + (3 + 2 * C) * B + 1])


def _pad_lens(num_tokens: int, num_rows: int) -> np.ndarray:
    """Token counts of `num_rows` pad rows holding `num_tokens` pad tokens: pad token k in row
    min(k, num_rows - 1)."""
    lens = np.zeros(num_rows, dtype=np.int64)
    first = min(num_tokens, num_rows - 1)
    lens[:first] = 1
    lens[-1] += num_tokens - first
    return lens


def for_runner(runner, max_tokens: int, max_rows: int) -> StepInputs:
    a = runner.allocator
    return StepInputs(max_tokens=max_tokens, max_rows=max_rows, page_table=a.page_table, page_size=a.page_size,
                      pad_slot=a.pad_slot, kv_pool=runner.kv_pool, state_pool=runner.state_pool,
                      device=runner.device)


def _wait(event: torch.cuda.Event | None) -> None:
    """Wait until the host buffer's last copy has run (CUDA; a no-op before its first copy)."""
    if event is not None:
        event.synchronize()


def _record(event: torch.cuda.Event | None) -> None:
    if event is not None:
        event.record()
