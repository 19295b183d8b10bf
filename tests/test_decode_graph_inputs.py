"""The decode graph derives its batch on the device from (ids, positions, slots) alone; it must
equal what ForwardBatch.build computes on the host, and padded rows must touch nothing."""

import torch

from hybrid_sgl.memory.allocator import Allocator
from hybrid_sgl.runner.cuda_graph import DecodeGraphs
from hybrid_sgl.runner.forward_batch import ForwardBatch, ForwardMode


def test_device_side_decode_batch_matches_host_build():
    alloc = Allocator(num_slots=6, num_pages=40, page_size=4, max_pages_per_request=10, device="cpu")
    slots, lens = [], [9, 1, 17, 4]
    for n in lens:
        slot = alloc.alloc_slot()
        alloc.grow(slot, n)
        slots.append(slot)
    graphs = DecodeGraphs(model=None, allocator=alloc, kv_pool=None, state_pool=None, max_bs=8,
                          device=torch.device("cpu"))
    ids, positions = [5, 6, 7, 8], [n - 1 for n in lens]
    b, bs = len(ids), 8
    graphs.host_view[0, :b], graphs.host_view[1, :b], graphs.host_view[2, :b] = ids, positions, slots
    graphs.host_view[2, b:bs] = alloc.pad_slot
    graphs.inputs.copy_(graphs.host_inputs)
    got = graphs._batch(bs)
    want = ForwardBatch.build(mode=ForwardMode.DECODE, token_runs=[[t] for t in ids], prefix_lens=positions,
                              slots=slots, page_table=alloc.page_table, page_size=4, kv_pool=None, state_pool=None,
                              device=torch.device("cpu"))
    width = want.block_table.shape[1]
    assert got.input_ids[:b].tolist() == want.input_ids.tolist()
    assert got.positions[:b].tolist() == want.positions.tolist()
    assert got.seq_lens[:b].tolist() == want.seq_lens.tolist()
    assert got.state_slots[:b].tolist() == want.state_slots.tolist()
    assert got.slot_mapping[:b].tolist() == want.slot_mapping.tolist()
    assert torch.equal(got.block_table[:b, :width], want.block_table)
    assert got.has_initial_state[:b].all()
    # padded rows: pad slot, no KV store, nothing to attend to, no pages
    assert got.state_slots[b:].tolist() == [alloc.pad_slot] * (bs - b)
    assert got.slot_mapping[b:].tolist() == [-1] * (bs - b)
    assert got.seq_lens[b:].tolist() == [0] * (bs - b)
    assert (got.block_table[b:] == alloc.pad_page).all()


def test_device_side_tokens_from_the_previous_step():
    """Overlapped decode: a token -(j + 1) is taken from prev_ids[j] on the device."""
    alloc = Allocator(num_slots=4, num_pages=8, page_size=4, max_pages_per_request=4, device="cpu")
    slots = [alloc.alloc_slot() for _ in range(3)]
    for slot in slots:
        alloc.grow(slot, 5)
    graphs = DecodeGraphs(model=None, allocator=alloc, kv_pool=None, state_pool=None, max_bs=4,
                          device=torch.device("cpu"), take_prev_ids=True)
    graphs.prev_ids[:3] = torch.tensor([101, 102, 103])
    graphs.host_view[0, :3], graphs.host_view[1, :3], graphs.host_view[2, :3] = [-3, 42, -1], [4, 4, 4], slots
    graphs.host_view[2, 3] = alloc.pad_slot
    graphs.inputs.copy_(graphs.host_inputs)
    assert graphs._batch(4).input_ids[:3].tolist() == [103, 42, 101]
