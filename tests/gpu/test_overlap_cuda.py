"""Overlapped decode on CUDA (decode graphs, Triton kernels, async token copies): the same tokens as
the plain scheduler. Skipped without CUDA."""

import pytest

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
