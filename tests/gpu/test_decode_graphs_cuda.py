"""Decode graph capture on CUDA: its warm-ups run on a stream of their own, which must wait for what the caller's
stream still has queued (the inputs' zero and pad-slot fills, the pools' initialization). Skipped without CUDA."""

import pytest
import torch
from torch import nn

from hybrid_sgl.memory.allocator import Allocator
from hybrid_sgl.runner.cuda_graph import DecodeGraphs

pytestmark = pytest.mark.gpu

VOCAB, HIDDEN = 64, 16


class _Embedding(nn.Module):
    """The part of a model the graph inputs feed: token ids -> embeddings -> logits [B, VOCAB]."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN, device="cuda")

    def forward(self, fb) -> torch.Tensor:
        return self.embed(fb.input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.embed.weight.t()


def test_capture_waits_for_the_inputs_the_callers_stream_writes():
    """The graph inputs hold stale values, and the fills that __init__ queues (zeros, the pad slot) are queued
    again behind about 0.1 s of work on the caller's stream. Warm-ups that did not wait for that stream would read
    the stale values as token ids and slots (an out-of-range index: a device-side assert); the captured step must
    give the logits of token 0 at every padded row. The step's kernels are loaded before the stream is made busy:
    with lazy module loading (CUDA's default) a kernel's first launch waits for the running kernels, which hid the
    race from the test's first two versions. bench/h200_round_run.sh's wait_check runs it with the wait
    removed, where it must fail."""
    device = torch.device("cuda")
    allocator = Allocator(num_slots=4, num_pages=8, page_size=4, max_pages_per_request=2, device=device)
    model = _Embedding()
    graphs = DecodeGraphs(model=model, allocator=allocator, kv_pool=None, state_pool=None, max_bs=8, device=device,
                          take_prev_ids=True)
    with torch.inference_mode():  # load every kernel of the step first: a kernel's first launch loads its module,
        graphs._forward(graphs.max_bs)  # which waits for the running sleep and so would order the fills first
    torch.cuda.synchronize()
    graphs.inputs.fill_(1 << 40)
    graphs.prev_ids.fill_(1 << 40)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # the caller's stream busy ...
    graphs.inputs.zero_()  # ... with the inputs' fills behind it
    graphs.inputs[2].fill_(allocator.pad_slot)
    graphs.prev_ids.zero_()
    graphs.capture()
    torch.cuda.synchronize()
    logits = graphs.run([0, 0], [0, 0], [allocator.pad_slot] * 2)
    torch.testing.assert_close(logits, model.compute_logits(model.embed.weight[[0, 0]]))
