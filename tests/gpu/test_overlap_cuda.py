"""Overlapped decode on CUDA (decode graphs, Triton kernels, async token copies): the same tokens as
the plain scheduler. Skipped without CUDA."""

import pytest
import torch

from tests.test_hf_parity import make_scheduler
from tests.test_overlap_schedule import requests, run

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h", "qwen3_5_moe"])
def test_overlapped_decode_matches_plain_on_cuda(tiny_checkpoint, family):
    path = tiny_checkpoint(family)
    kw = dict(device="cuda", chunked_prefill_size=16, cuda_graph_max_bs=8)
    plain = make_scheduler(path, disable_overlap_schedule=True, **kw)
    base = requests(plain.vocab_size, device="cuda")
    run(plain, base)
    over = make_scheduler(path, **kw)
    assert over.runner.graphs is not None
    over_reqs = requests(over.vocab_size, device="cuda")
    run(over, over_reqs)
    assert over.num_overlapped_steps > 0
    for a, b in zip(base, over_reqs):
        assert b.output_ids == a.output_ids, a.rid


def test_blind_steps_grow_pages_without_waiting_for_the_device(tiny_checkpoint):
    """The follow-up step, built while the previous one runs, gives requests their next pages (every 4 tokens
    here) without a blocking copy: one would wait for the step in flight."""
    path = tiny_checkpoint("qwen3_5")
    s = make_scheduler(path, device="cuda", chunked_prefill_size=16, cuda_graph_max_bs=8, page_size=4)
    follow_up, grown = s._follow_up, []

    def strict(pending):
        free = s.allocator.num_free_pages
        torch.cuda.set_sync_debug_mode("error")
        try:
            return follow_up(pending)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            grown.append(free - s.allocator.num_free_pages)

    s._follow_up = strict
    run(s, requests(s.vocab_size, device="cuda"))
    assert s.num_overlapped_steps > 5 and sum(n > 0 for n in grown) > 3, grown  # pages given in blind steps
