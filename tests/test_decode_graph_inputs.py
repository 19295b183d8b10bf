"""The step-input builder: a plan padded to a graph's shape gives the same ForwardBatch rows as the
plan at its own shape, pad rows touch nothing, previous-step tokens come from the device, and the
two pinned host buffers alternate."""

import dataclasses

import pytest
import torch

from hybrid_sgl.batch import MAX_CUTS, ForwardMode, StepPlan
from hybrid_sgl.memory.allocator import Allocator
from hybrid_sgl.runner.step_inputs import StepInputs


def _inputs(alloc: Allocator, max_tokens: int = 64, max_rows: int = 9) -> StepInputs:
    return StepInputs(max_tokens=max_tokens, max_rows=max_rows, page_table=alloc.page_table,
                      page_size=alloc.page_size, pad_slot=alloc.pad_slot, kv_pool=None, state_pool=None,
                      device=torch.device("cpu"))


def _snapshot(fb):
    """The batch's tensors copied out of the builder's buffers (which the next fill overwrites)."""
    return dataclasses.replace(fb, **{f.name: getattr(fb, f.name).clone() for f in dataclasses.fields(fb)
                                      if isinstance(getattr(fb, f.name), torch.Tensor)})


def _requests(alloc: Allocator, lens: list[int]) -> list[int]:
    slots = []
    for n in lens:
        slot = alloc.alloc_slot()
        alloc.grow(slot, n)
        slots.append(slot)
    return slots


def test_decode_plan_padded_to_its_graph_shape():
    alloc = Allocator(num_slots=6, num_pages=40, page_size=4, max_pages_per_request=10, device="cpu")
    lens = [9, 1, 17, 4]
    slots = _requests(alloc, lens)
    plan = StepPlan(mode=ForwardMode.DECODE, tokens=[[5], [6], [7], [8]], prefix_lens=[n - 1 for n in lens],
                    slots=slots)
    inputs = _inputs(alloc)
    want = _snapshot(inputs.eager_batch(plan))
    b, bs = 4, 8
    inputs.fill(plan, bs, bs)
    got = inputs.batch(ForwardMode.DECODE, bs, bs)
    width = want.block_table.shape[1]
    assert want.input_ids.tolist() == [5, 6, 7, 8]
    assert want.positions.tolist() == [8, 0, 16, 3]
    assert want.seq_lens.tolist() == lens
    for name in ("input_ids", "positions", "seq_lens", "state_slots", "slot_mapping"):
        assert getattr(got, name)[:b].tolist() == getattr(want, name).tolist(), name
    assert torch.equal(got.block_table[:b, :width], want.block_table)
    assert got.has_initial_state[:b].tolist() == [True, False, True, True]
    assert got.cu_seqlens.tolist() == list(range(bs + 1))
    # padded rows: pad slot, no KV store, no pages, no initial state
    assert got.state_slots[b:].tolist() == [alloc.pad_slot] * (bs - b)
    assert got.slot_mapping[b:].tolist() == [-1] * (bs - b)
    assert (got.block_table[b:] == alloc.pad_page).all()
    assert not got.has_initial_state[b:].any()


def test_extend_plan_padded_keeps_every_real_row():
    """Two prompt chunks (one continuing a cached prefix) in an extend shape of 32 tokens, 8 rows: the
    real rows equal the unpadded build; the 19 pad tokens sit in pad rows that own them."""
    alloc = Allocator(num_slots=6, num_pages=40, page_size=4, max_pages_per_request=10, device="cpu")
    slots = _requests(alloc, [10, 13])
    plan = StepPlan(mode=ForwardMode.EXTEND, tokens=[list(range(100, 110)), [7, 8, 9]], prefix_lens=[0, 10],
                    slots=slots)
    inputs = _inputs(alloc)
    want = _snapshot(inputs.eager_batch(plan))
    inputs.fill(plan, 32, 8)
    got = inputs.batch(ForwardMode.EXTEND, 32, 8)
    t, b = 13, 2
    assert want.positions.tolist() == list(range(10)) + [10, 11, 12]
    assert want.cu_seqlens.tolist() == [0, 10, 13]
    assert want.has_initial_state.tolist() == [False, True]
    for name in ("input_ids", "positions", "slot_mapping"):
        assert getattr(got, name)[:t].tolist() == getattr(want, name).tolist(), name
    for name in ("seq_lens", "state_slots", "has_initial_state"):
        assert getattr(got, name)[:b].tolist() == getattr(want, name).tolist(), name
    assert got.cu_seqlens[:b + 1].tolist() == want.cu_seqlens.tolist()
    assert got.cu_seqlens[-1].item() == 32  # every pad token belongs to a pad row
    assert (got.cu_seqlens[1:] >= got.cu_seqlens[:-1]).all()
    assert got.state_slots[b:].tolist() == [alloc.pad_slot] * 6
    assert got.slot_mapping[t:].tolist() == [-1] * 19
    pad_lens = (got.cu_seqlens[b + 1:] - got.cu_seqlens[b:-1]).tolist()
    assert pad_lens == [1, 1, 1, 1, 1, 14] and got.seq_lens[b:].tolist() == pad_lens


def test_device_side_tokens_from_the_previous_step():
    """Overlapped decode: a row whose prev row is j takes prev_ids[j] on the device."""
    alloc = Allocator(num_slots=4, num_pages=8, page_size=4, max_pages_per_request=4, device="cpu")
    slots = _requests(alloc, [5, 5, 5])
    inputs = _inputs(alloc, max_tokens=8, max_rows=5)
    plan = StepPlan(mode=ForwardMode.DECODE, tokens=[[0], [42], [0]], prefix_lens=[4] * 3, slots=slots,
                    prev_rows=[2, -1, 0])
    inputs.fill(plan, 4, 4, prev_ids=torch.tensor([101, 102, 103]))
    assert inputs.batch(ForwardMode.DECODE, 4, 4, with_prev=True).input_ids[:3].tolist() == [103, 42, 101]
    assert inputs.eager_batch(plan, prev_ids=torch.tensor([101, 102, 103])).input_ids.tolist() == [103, 42, 101]


def test_steps_fill_the_two_host_buffers_in_turn():
    """Each fill writes the other pinned buffer than the fill before: the copy of a launched step that
    still waits in the stream reads what the host wrote for that step, not the next one's."""
    alloc = Allocator(num_slots=4, num_pages=8, page_size=4, max_pages_per_request=4, device="cpu")
    inputs = _inputs(alloc, max_tokens=8, max_rows=5)
    slots = _requests(alloc, [2, 3, 4, 5])
    inputs.fill(StepPlan(mode=ForwardMode.DECODE, tokens=[[5], [6], [7]], prefix_lens=[1, 2, 3], slots=slots[:3]),
                4, 4)
    first = inputs.host[inputs.turn].clone()
    inputs.fill(StepPlan(mode=ForwardMode.DECODE, tokens=[[8]], prefix_lens=[4], slots=slots[3:]), 1, 1)
    assert torch.equal(inputs.host[1 - inputs.turn], first)  # the first step's buffer, untouched
    assert inputs.batch(ForwardMode.DECODE, 1, 1).input_ids.tolist() == [8]


def test_snapshot_cuts_travel_as_device_arrays():
    """Cuts become run-relative token counts and state-pool rows, sorted per row, -1 elsewhere; a padded
    shape carries the same cuts in its first rows."""
    alloc = Allocator(num_slots=6, num_pages=40, page_size=4, max_pages_per_request=10, device="cpu")
    slots = _requests(alloc, [20, 12])
    plan = StepPlan(mode=ForwardMode.EXTEND, tokens=[list(range(12)), list(range(12))], prefix_lens=[8, 0],
                    slots=slots, snapshots=[[(20, 9), (12, 8)], [(5, 7)]])
    inputs = StepInputs(max_tokens=64, max_rows=9, page_table=alloc.page_table, page_size=alloc.page_size,
                        pad_slot=alloc.pad_slot, kv_pool=None, state_pool=object(), device=torch.device("cpu"))
    for shape in ((24, 2), (32, 4)):
        inputs.fill(plan, *shape)
        fb = inputs.batch(ForwardMode.EXTEND, *shape)
        assert fb.snap_pos.shape == fb.snap_slots.shape == (shape[1], MAX_CUTS)
        assert fb.snap_pos[0, :3].tolist() == [4, 12, -1] and fb.snap_slots[0, :3].tolist() == [8, 9, -1]
        assert fb.snap_pos[1, :2].tolist() == [5, -1] and fb.snap_slots[1, :2].tolist() == [7, -1]
        assert (fb.snap_pos[2:] == -1).all() and (fb.snap_slots[2:] == -1).all()
    decode = StepPlan(mode=ForwardMode.DECODE, tokens=[[1], [2]], prefix_lens=[19, 11], slots=slots)
    assert inputs.eager_batch(decode).snap_pos is None  # decode steps never cut


def test_snapshot_cut_outside_its_run_is_refused():
    alloc = Allocator(num_slots=2, num_pages=10, page_size=4, max_pages_per_request=5, device="cpu")
    slots = _requests(alloc, [8])
    inputs = _inputs(alloc)
    bad = StepPlan(mode=ForwardMode.EXTEND, tokens=[[1, 2, 3, 4]], prefix_lens=[4], slots=slots,
                   snapshots=[[(4, 3)]])  # the state after 4 tokens is the slot's own: not inside this run
    with pytest.raises(AssertionError, match="outside row 0's run"):
        inputs.fill(bad)
