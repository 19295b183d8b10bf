"""Speculative decoding on CUDA through the Triton kernels, float32: verify steps replay the extend
graphs with their cuts, and greedy output equals plain decoding, with the MTP layer's drafts and with
test-only drafts that are mostly right (so that rollback runs at every depth); with --speculative-rollback
replay too (the verify graphs keep their inputs and write no GDN state, the kept tokens are replayed after
each verify step, by a kernel variant compiled in the warm-up), graphed and eager. Skipped without CUDA."""

import pytest
import torch

from hybrid_sgl.engine import Engine
from hybrid_sgl.runner.speculative import SpecDecoder
from tests.gpu.test_model_cuda import BACKENDS
from tests.test_speculative import BASE, GREEDY, PROMPTS, SPEC, ScriptedDrafts, _generate, generate_each
from tests.test_speculative_replay import REPLAY

pytestmark = pytest.mark.gpu
CUDA = dict(device="cuda", **BACKENDS["triton"])


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_greedy_output_equals_plain_decoding_on_cuda(tiny_checkpoint, monkeypatch, family):
    path = tiny_checkpoint(family, mtp=True)
    plain, _ = _generate(path, PROMPTS, GREEDY, **CUDA)
    spec, _ = _generate(path, PROMPTS, GREEDY, **CUDA, **SPEC)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    truth = {tuple(prompt): o["output_ids"] for prompt, o in zip(PROMPTS, plain)}
    scripted = ScriptedDrafts(truth, 0.8, seed=3)
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))
    spec, stats = _generate(path, PROMPTS, GREEDY, **CUDA, **SPEC)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert stats["avg_spec_accept_length"] > 1.5


def test_verify_and_draft_graphs_replay_and_match_eager_steps(tiny_checkpoint):
    """With CUDA graphs, verify steps replay the short-row verify graphs and the MTP passes their draft
    graphs; the drafts, verify counts and tokens equal those of the eager steps (--disable-cuda-graph)."""
    path = tiny_checkpoint("qwen3_5", mtp=True)

    def run(**kw):
        with Engine(model_path=path, dtype="float32", log_level="warning", **CUDA, **SPEC, **kw) as engine:
            replays = {"verify": 0, "first": 0, "chain": 0}
            r, spec = engine.runner, engine.runner.speculative
            for name, graphs in (("verify", r.verify_graphs), ("first", spec.first_graphs),
                                 ("chain", spec.chain_graphs)):
                if graphs is not None:
                    run_ = graphs.run
                    graphs.run = lambda *a, _r=run_, _n=name, **k: (replays.__setitem__(_n, replays[_n] + 1),
                                                                   _r(*a, **k))[1]
            outs = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
            engine.check_integrity()
        return outs, replays

    graphed, replays = run()
    eager, none = run(disable_cuda_graph=True)
    assert all(n > 0 for n in replays.values()), replays
    assert not any(none.values())
    assert [o["output_ids"] for o in graphed] == [o["output_ids"] for o in eager]
    assert [o["meta_info"]["spec_verify_ct"] for o in graphed] == [o["meta_info"]["spec_verify_ct"] for o in eager]


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_replayed_rollback_on_cuda_graphed_and_eager(tiny_checkpoint, monkeypatch, family):
    path = tiny_checkpoint(family, mtp=True)
    plain, _ = _generate(path, PROMPTS, GREEDY, **CUDA)
    truth = {tuple(prompt): o["output_ids"] for prompt, o in zip(PROMPTS, plain)}
    scripted = ScriptedDrafts(truth, 0.8, seed=3)
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))

    def run(**kw):
        with Engine(model_path=path, dtype="float32", log_level="warning", **CUDA, **REPLAY, **kw) as engine:
            verify = engine.runner.verify_graphs
            replays = [0]
            if verify is not None:
                assert verify.replay_recurrent
                real = verify.run
                verify.run = lambda *a, **k: (replays.__setitem__(0, replays[0] + 1), real(*a, **k))[1]
            outs = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
            engine.check_integrity()
            # the replay's kernel variant was compiled by SpecDecoder.warm_up, not at the first rollback
            assert not [c for c in engine.runner.compile_watch.after_warm_up if "gdn_rows" in c]
        return outs, replays[0]

    graphed, verify_replays = run()
    eager, _ = run(disable_cuda_graph=True)
    assert verify_replays > 0
    assert [o["output_ids"] for o in graphed] == [o["output_ids"] for o in plain]
    assert [o["output_ids"] for o in eager] == [o["output_ids"] for o in plain]


def test_constrained_and_logprob_requests_take_drafts_on_cuda(tiny_checkpoint, monkeypatch):
    """A constrained request's drafts are checked against its grammar and verified under device masks, and a
    logprob request's logprobs come off its verify rows: tokens equal plain decoding's, logprobs within 1e-4."""
    path = tiny_checkpoint("qwen3_5", mtp=True)
    params = [{"max_new_tokens": 12, "temperature": 0, "regex": "[a-z]+[0-9]"}, GREEDY]
    plain = generate_each(path, params, logprobs_at=1, **CUDA)
    truth = {tuple(prompt): o["output_ids"] for prompt, o in zip(PROMPTS, plain)}
    scripted = ScriptedDrafts(truth, 0.8, seed=5)
    monkeypatch.setattr(SpecDecoder, "draft", lambda self, entries: scripted(self, entries))
    spec = generate_each(path, params, logprobs_at=1, **CUDA, **SPEC)
    assert [o["output_ids"] for o in spec] == [o["output_ids"] for o in plain]
    assert all(0 < o["meta_info"]["spec_verify_ct"] < len(o["output_ids"]) for o in spec)
    got, want = (o["meta_info"]["output_token_logprobs"] for o in (spec[1], plain[1]))
    assert [v for v, *_ in got] == pytest.approx([v for v, *_ in want], abs=1e-4)


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_chained_iterations_replay_their_graphs_and_equal_plain_decoding(tiny_checkpoint, family):
    """Chained iterations (the default) on CUDA: every iteration of up to the captured row counts replays its graph
    (verify, accept, rollback, MTP passes) and greedy output equals plain decoding; so does a row sampled at a
    near-zero temperature beside them (the sampled graphs)."""
    from hybrid_sgl.runner.spec_chain import SpecChain

    path = tiny_checkpoint(family, mtp=True)
    plain, _ = _generate(path, PROMPTS, GREEDY, **CUDA)
    replays, eager = [0], [0]
    iterate = SpecChain._iterate

    def counting_iterate(self, rows, sampled=False):
        eager[0] += not torch.cuda.is_current_stream_capturing() and (rows, sampled) not in self.graphs
        return iterate(self, rows, sampled)

    with Engine(model_path=path, **{**BASE, **CUDA, **SPEC, "disable_speculative_overlap": False}) as engine:
        chain = engine.runner.speculative.chain
        assert chain.graphs
        for graph, _ in chain.graphs.values():
            real = graph.replay
            graph.replay = lambda _r=real: (replays.__setitem__(0, replays[0] + 1), _r())[1]
        SpecChain._iterate = counting_iterate
        try:
            outs = engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)
            near_greedy = engine.generate(input_ids=PROMPTS, sampling_params=[
                {**GREEDY, "temperature": 1e-4} if i % 2 else GREEDY for i in range(len(PROMPTS))])
        finally:
            SpecChain._iterate = iterate
        engine.check_integrity()
        overlapped = engine.scheduler.num_overlapped_steps
    assert [o["output_ids"] for o in outs] == [o["output_ids"] for o in plain]
    assert [o["output_ids"] for o in near_greedy] == [o["output_ids"] for o in plain]
    assert replays[0] > 0 and eager[0] == 0 and overlapped > 0
