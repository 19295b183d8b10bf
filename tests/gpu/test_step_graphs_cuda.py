"""Extend / prefill CUDA graphs on every family: replays equal eager steps (tokens exact in float32,
logprobs close), the graphs were really replayed, and neither a decode nor an extend step syncs
with the host, graphs on or off. Skipped without CUDA."""

import pytest
import torch

from hybrid_sgl.batch import ForwardMode, StepPlan
from tests.gpu.test_model_cuda import BACKENDS, FAMILIES
from tests.test_hf_parity import full_request, make_scheduler, prompt_of, run_to_end

pytestmark = pytest.mark.gpu


def _run(path: str, graphs: bool, chunk: int = 48):
    s = make_scheduler(path, device="cuda", chunked_prefill_size=chunk, page_size=16,
                       cuda_graph_max_tokens=chunk if graphs else 0, **BACKENDS["triton"])
    assert (s.runner.extend_graphs is not None) == graphs
    replays = [0]
    if graphs:
        run = s.runner.extend_graphs.run
        s.runner.extend_graphs.run = lambda *a, **k: (replays.__setitem__(0, replays[0] + 1), run(*a, **k))[1]
    vocab = s.vocab_size
    reqs = [full_request(f"r{i}", prompt_of(n, 50 + i, vocab), vocab, max_new=m)
            for i, (n, m) in enumerate([(67, 6), (5, 4), (130, 5), (33, 3)])]
    run_to_end(s, {0: reqs[:1], 2: reqs[1:3], 5: reqs[3:]})
    return reqs, replays[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_extend_graphs_match_eager_float32(tiny_checkpoint, family):
    path = tiny_checkpoint(family)
    graphed, replays = _run(path, graphs=True)
    eager, _ = _run(path, graphs=False)
    assert replays >= 4  # prompt chunks went through the graphs
    for g, e in zip(graphed, eager):
        assert g.output_ids == e.output_ids, g.rid
        got = torch.tensor([lp for lp, _ in g.input_token_logprobs[1:] + g.output_token_logprobs])
        want = torch.tensor([lp for lp, _ in e.input_token_logprobs[1:] + e.output_token_logprobs])
        torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h", "jamba"])
def test_decode_and_extend_steps_never_sync(tiny_checkpoint, family, graphs):
    path = tiny_checkpoint(family)
    s = make_scheduler(path, device="cuda", chunked_prefill_size=64, page_size=16,
                       disable_cuda_graph=not graphs, **BACKENDS["triton"])
    runner, a = s.runner, s.allocator
    slots = [a.alloc_slot() for _ in range(3)]
    for slot in slots:
        a.grow(slot, 80)
    vocab = s.vocab_size
    extend = StepPlan(mode=ForwardMode.EXTEND, tokens=[prompt_of(40, 1, vocab), prompt_of(7, 2, vocab)],
                      prefix_lens=[0, 20], slots=slots[:2], logit_rows=[39, 46])
    decode = StepPlan(mode=ForwardMode.DECODE, tokens=[[3], [4], [5]], prefix_lens=[40, 27, 9], slots=slots)
    for _ in range(2):  # the first steps compile; the checked ones run warm
        runner.forward_step(extend)
        runner.forward_step(decode)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        logits = runner.forward_step(extend)
        if graphs:
            shape = runner.graphs.shape_for(decode)
            decode_logits = runner.graphs.run(decode, shape, prev_ids=None)
        else:
            decode_logits = runner.forward_step(decode)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert logits.shape == (2, vocab) and decode_logits.shape == (3, vocab)
    assert torch.isfinite(logits).all() and torch.isfinite(decode_logits).all()


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h", "falcon_h1", "jamba"])
def test_snapshot_cuts_inside_graphed_extend_steps(tiny_checkpoint, family):
    """A step with snapshot cuts replays its shape's graph; each snapshot holds the state (conv and
    recurrent) of a prefill of only the tokens before its cut, and the step itself is not changed by them
    (beyond float32 rounding)."""
    path = tiny_checkpoint(family)
    s = make_scheduler(path, device="cuda", chunked_prefill_size=96, page_size=16, cuda_graph_max_tokens=96,
                       **BACKENDS["triton"])
    runner, a = s.runner, s.allocator
    pool = runner.state_pool
    slots = [a.alloc_slot() for _ in range(2)]
    for slot in slots:
        a.grow(slot, 96)
    snaps = [a.alloc_snapshot() for _ in range(3)]
    vocab = s.vocab_size
    runs = [prompt_of(70, 3, vocab), prompt_of(21, 4, vocab)]
    cut = StepPlan(mode=ForwardMode.EXTEND, tokens=runs, prefix_lens=[0, 0], slots=slots,
                   snapshots=[[(33, snaps[0]), (64, snaps[1])], [(21, snaps[2])]], logit_rows=[69, 90])
    assert runner.extend_graphs.shape_for(cut) is not None
    logits = runner.forward_step(cut).clone()
    got = [(pool.conv[:, i].clone(), pool.ssm[:, i].clone()) for i in snaps]
    plain = StepPlan(mode=ForwardMode.EXTEND, tokens=runs, prefix_lens=[0, 0], slots=slots, logit_rows=[69, 90])
    # the cut variant of a state kernel is another compiled program: float32 sums may reassociate (6e-7 seen)
    torch.testing.assert_close(runner.forward_step(plain), logits, atol=1e-5, rtol=1e-5)
    for (row, p), (conv, ssm) in zip([(0, 33), (0, 64), (1, 21)], got):
        alone = StepPlan(mode=ForwardMode.EXTEND, tokens=[runs[row][:p]], prefix_lens=[0], slots=[slots[0]],
                         logit_rows=[])
        runner.forward_step(alone)
        torch.testing.assert_close(conv, pool.conv[:, slots[0]], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ssm, pool.ssm[:, slots[0]], atol=1e-4, rtol=1e-4)
