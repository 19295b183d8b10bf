"""Overlapped decode (--enable-overlap-schedule): the same tokens and finish reasons as the plain
scheduler, through staggered arrivals, length / stop-token finishes, seeded sampling and aborts,
with the pools intact after every step and empty at the end."""

import pytest
import torch

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.runner.model_runner import ModelRunner
from hybrid_sgl.sampling_params import SamplingParams
from hybrid_sgl.scheduler.prefix_sharing import prefix_sharing_for
from hybrid_sgl.scheduler.request import Req
from hybrid_sgl.scheduler.scheduler import Scheduler
from hybrid_sgl.server_args import ServerArgs
from tests.test_hf_parity import make_scheduler, prompt_of


def requests(vocab: int, stop_token: int | None = None, device: str = "cpu") -> list[Req]:
    specs = [(23, 9, {}), (5, 14, {}), (41, 6, {"temperature": 0.8, "top_p": 0.9}), (1, 11, {}), (9, 12, {})]
    reqs = []
    for i, (n, m, extra) in enumerate(specs):
        stops = [stop_token] if (stop_token is not None and i == 4) else []
        params = SamplingParams(max_new_tokens=m, temperature=extra.get("temperature", 0.0),
                                top_p=extra.get("top_p", 1.0), ignore_eos=True, stop_token_ids=stops)
        gen = torch.Generator(device=device).manual_seed(7) if extra else None
        reqs.append(Req(rid=f"r{i}", prompt_ids=prompt_of(n, 40 + i, vocab), params=params, generator=gen))
    return reqs


def run(s, reqs, abort_at: dict[int, str] | None = None) -> int:
    arrivals = {0: reqs[:2], 3: reqs[2:4], 9: reqs[4:]}
    step = 0
    while s.has_work or any(k >= step for k in arrivals):
        for req in arrivals.get(step, []):
            s.add(req)
        if abort_at and step in abort_at:
            s.abort(abort_at[step])
        s.step()
        s.allocator.check_integrity()
        step += 1
        assert step < 500
    assert s.allocator.num_free_pages == s.allocator.num_pages
    assert s.allocator.num_free_slots == s.allocator.num_slots
    return step


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h"])
def test_overlapped_decode_matches_plain(tiny_checkpoint, family):
    path = tiny_checkpoint(family)
    plain = make_scheduler(path, chunked_prefill_size=16, disable_overlap_schedule=True)
    vocab = plain.vocab_size
    base = requests(vocab)
    run(plain, base)
    stop_token = base[4].output_ids[5]  # request 4 stops at its 6th token (or at an earlier repeat)
    base = requests(vocab, stop_token)
    run(make_scheduler(path, chunked_prefill_size=16, disable_overlap_schedule=True), base)
    over_reqs = requests(vocab, stop_token)
    over = make_scheduler(path, chunked_prefill_size=16)
    run(over, over_reqs)
    assert over.num_overlapped_steps > 0
    for a, b in zip(base, over_reqs):
        assert b.output_ids == a.output_ids, a.rid
        assert b.finish_reason == a.finish_reason, a.rid
    assert over_reqs[4].finish_reason["type"] == "stop"


def test_abort_while_a_step_is_in_flight(tiny_checkpoint):
    path = tiny_checkpoint("qwen3_5")
    s = make_scheduler(path, chunked_prefill_size=16)
    reqs = requests(s.vocab_size)
    run(s, reqs, abort_at={5: "r1", 6: "r0"})
    assert s.num_overlapped_steps > 0
    assert reqs[0].finish_reason["type"] == "abort" and reqs[1].finish_reason["type"] == "abort"
    for req in reqs[2:]:
        assert len(req.output_ids) == req.params.max_new_tokens


def test_logprob_requests_run_synchronously(tiny_checkpoint):
    path = tiny_checkpoint("qwen3_5")
    s = make_scheduler(path, chunked_prefill_size=16)
    req = Req(rid="lp", prompt_ids=prompt_of(9, 1, s.vocab_size), return_logprob=True,
              params=SamplingParams(max_new_tokens=6, temperature=0, ignore_eos=True))
    run(s, [req, *requests(s.vocab_size)[:1]])
    assert len(req.output_token_logprobs) == 6


def test_engine_with_overlap_streams_the_same_text(tiny_checkpoint):
    from hybrid_sgl import Engine

    path = tiny_checkpoint("qwen3_5")
    params = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    prompts = ["The capital of France is", "Hello", "def add(a, b):"]
    outs = {}
    for overlap in (False, True):
        engine = Engine(model_path=path, device="cpu", dtype="float32", disable_overlap_schedule=not overlap)
        try:
            outs[overlap] = [o["output_ids"] for o in engine.generate(prompts, params)]
            streamed = [c["text"] for c in engine.generate(prompts[0], params, stream=True)]
        finally:
            engine.shutdown()
        assert streamed[-1] == engine_text(path, outs[overlap][0])  # chunks carry the text so far
    assert outs[True] == outs[False]


def engine_text(path: str, ids: list[int]) -> str:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path).decode(ids)


def test_overlap_goes_on_when_cached_prefixes_fill_the_pool(tiny_checkpoint):
    """A pool full of unused cached prefixes: the blind follow-up step evicts them, as the plain step
    would, instead of falling back to a step that waits for the host (one per page boundary)."""
    path = tiny_checkpoint("qwen3_5")

    def scheduler() -> Scheduler:
        # 4 requests of 64 tokens take 4 pages each, plus a page of admission headroom: 20 pages fit one batch
        args = ServerArgs(model_path=path, device="cpu", dtype="float32", page_size=16,
                          max_total_tokens=20 * 16).resolved()
        runner = ModelRunner(args, ModelConfig.from_hf(path))
        sharing = prefix_sharing_for(runner.pools, disable=False, snapshot_interval=None, policy=args.schedule_policy)
        return Scheduler(runner, allocator=runner.pools.allocator, chunked_prefill_size=-1, overlap=True,
                         sharing=sharing)

    def batch(seed: int) -> list[Req]:
        params = SamplingParams(max_new_tokens=34, temperature=0, ignore_eos=True)
        return [Req(rid=f"b{seed}-{i}", prompt_ids=prompt_of(30, seed + i, 400), params=params) for i in range(4)]

    def decode(s: Scheduler, reqs: list[Req]) -> int:
        before = s.num_overlapped_steps
        for req in reqs:
            s.add(req)
        while s.has_work:
            s.step()
            s.check_integrity()
        return s.num_overlapped_steps - before

    expected = batch(100)
    steps = decode(scheduler(), expected)
    s = scheduler()
    decode(s, batch(0))
    assert s.cache_stats()["evictable_pages"] >= 8  # the first batch's prompts and outputs stay cached
    second = batch(100)
    assert decode(s, second) == steps > 20
    assert [r.output_ids for r in second] == [r.output_ids for r in expected]
