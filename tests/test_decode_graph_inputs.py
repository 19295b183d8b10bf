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
    graphs.inputs[0, :b], graphs.inputs[1, :b], graphs.inputs[2, :b] = map(torch.tensor, (ids, positions, slots))
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
    graphs.inputs[0, :3], graphs.inputs[1, :3], graphs.inputs[2, :3] = map(torch.tensor, ([-3, 42, -1], [4] * 3, slots))
    assert graphs._batch(4).input_ids[:3].tolist() == [103, 42, 101]


def test_steps_fill_the_two_host_buffers_in_turn():
    """run() fills each step's inputs in the other pinned buffer than the step before: the copy of a launched step
    that still waits in the stream reads what the host wrote for that step, not the next one's. Each replay sees
    its own step's rows, padded rows carrying the pad slot."""
    alloc = Allocator(num_slots=4, num_pages=8, page_size=4, max_pages_per_request=4, device="cpu")
    graphs = DecodeGraphs(model=None, allocator=alloc, kv_pool=None, state_pool=None, max_bs=4,
                          device=torch.device("cpu"))
    seen = []

    class Replay:
        def replay(self):
            seen.append(graphs.inputs.clone())

    graphs.graphs = {bs: Replay() for bs in graphs.sizes}
    graphs.logits = {bs: torch.zeros(bs, 2) for bs in graphs.sizes}
    graphs.run([5, 6, 7], [1, 2, 3], [0, 1, 2])
    first = graphs.host_inputs[graphs.turn].clone()
    graphs.run([8], [4], [3])
    assert torch.equal(graphs.host_inputs[1 - graphs.turn], first)  # the first step's buffer, untouched
    assert seen[0][:, :4].tolist() == [[5, 6, 7, 0], [1, 2, 3, 0], [0, 1, 2, alloc.pad_slot]]
    assert seen[1][:, :1].tolist() == [[8], [4], [3]]
