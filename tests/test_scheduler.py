"""Scheduler invariants with a stand-in runner: random arrive / step / abort sequences never leak
or double-allocate slots or pages, every batch is consistent with the pools, and every request
ends (finished or aborted) with nothing left allocated."""

import random
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_sgl.batch import ForwardMode
from hybrid_sgl.memory.allocator import Allocator
from hybrid_sgl.runner.model_runner import ModelRunner
from hybrid_sgl.runner.step_results import ItemResult
from hybrid_sgl.sampling_params import SamplingParams
from hybrid_sgl.scheduler.request import Req, ReqStatus
from hybrid_sgl.scheduler.scheduler import AdmissionError, Scheduler

EOS = 0


class FakeRunner:
    """Checks each batch against the allocator and returns random tokens."""

    def __init__(self, *, num_slots, num_pages, page_size, context_length, chunk, seed):
        self.allocator = Allocator(num_slots=num_slots, num_pages=num_pages, page_size=page_size,
                                   max_pages_per_request=-(-context_length // page_size), device="cpu")
        self.context_length = context_length
        self.config = SimpleNamespace(vocab_size=50, eos_token_ids=(EOS,))
        self.chunk = chunk
        self.rng = random.Random(seed)
        self.batches = []
        self.late_samples = 0  # decode steps sampled after their launch

    def run(self, mode, items, while_running=None):
        slots = [it.req.slot for it in items]
        assert len(set(slots)) == len(slots) and None not in slots
        if mode is ForwardMode.DECODE:
            assert all(it.end - it.start == 1 and it.start > 0 for it in items)
        else:
            assert sum(it.end - it.start for it in items) <= self.chunk
        for it in items:
            req = it.req
            assert req.status is ReqStatus.RUNNING
            assert it.start == req.num_computed and it.end <= req.seq_len
            assert len(self.allocator.slot_pages[req.slot]) * self.allocator.page_size >= it.end
        self.batches.append((mode, len(items)))
        if while_running is not None:
            while_running()
        return [ItemResult(next_token=self.rng.randrange(50) if it.sample else None) for it in items]

    can_overlap = staticmethod(ModelRunner.can_overlap)

    def launch_decode(self, items, prev=None, prev_rows=None, sample=True):
        """Overlapped decode: item i continues from prev's row prev_rows[i] (one token not applied yet). A
        batch samples at launch unless it has a grammar and launches behind a step not read yet."""
        assert sample == (prev is None or all(it.req.grammar is None for it in items)), "the sampling rule"
        self.late_samples += not sample
        prev_rows = prev_rows or [-1] * len(items)
        slots = [it.req.slot for it in items]
        assert len(set(slots)) == len(slots) and None not in slots
        for it, j in zip(items, prev_rows):
            req = it.req
            assert req.status is ReqStatus.RUNNING and it.end - it.start == 1 and it.sample
            assert it.start == req.num_computed + (j >= 0), (it.start, req.num_computed, j)
            if j >= 0:
                assert prev.items[j].req is req and prev.items[j].end == it.start
            assert len(self.allocator.slot_pages[req.slot]) * self.allocator.page_size >= it.end
        self.batches.append((ForwardMode.DECODE, len(items)))
        tokens = [self.rng.randrange(50) for _ in items]
        return SimpleNamespace(items=items, deferred=[],
                               results=lambda: [ItemResult(next_token=t) for t in tokens])

    def sample_pending(self, pending):
        """A step launched unsampled: the step before it must have been applied by now."""
        for it in pending.items:
            assert it.req.status is not ReqStatus.RUNNING or it.req.num_computed == it.start, it.req.rid


def run_until_idle(s: Scheduler, check, max_steps: int) -> None:
    """Step until nothing is left to do, checking the pools after each step."""
    for _ in range(max_steps):
        if not s.has_work:
            break
        s.step()
        check(s)
    assert not s.has_work, "the scheduler stopped making progress"


def check(s: Scheduler):
    s.allocator.check_integrity()
    running_slots = [r.slot for r in s.running]
    held = [r.slot for r in s.pipeline.holders()]  # finished, their slots in the step in flight
    assert None not in running_slots + held and len(set(running_slots + held)) == len(running_slots + held)
    assert s.allocator.num_free_slots == s.allocator.num_slots - len(running_slots) - len(held)
    assert all(r.slot is None and r.status is ReqStatus.WAITING for r in s.waiting)


events = st.lists(st.one_of(
    st.tuples(st.just("arrive"), st.integers(1, 40), st.integers(0, 30)),
    st.tuples(st.just("step"), st.integers(1, 4), st.just(0)),
    st.tuples(st.just("abort"), st.integers(0, 100), st.just(0)),
), min_size=1, max_size=40)


@settings(max_examples=120, deadline=None)
@given(events, st.integers(0, 10_000), st.sampled_from([3, 8, 64]), st.booleans())
def test_random_workloads_keep_pools_consistent(sequence, seed, chunk, overlap):
    runner = FakeRunner(num_slots=3, num_pages=14, page_size=4, context_length=48, chunk=chunk, seed=seed)
    s = Scheduler(runner, allocator=runner.allocator, chunked_prefill_size=chunk, overlap=overlap)
    reqs: list[Req] = []
    for kind, a, b in sequence:
        if kind == "arrive":
            req = Req(rid=f"r{len(reqs)}", prompt_ids=[1] * a, params=SamplingParams(max_new_tokens=b))
            try:
                s.add(req)
                reqs.append(req)
            except AdmissionError:
                assert a + b > runner.context_length
        elif kind == "step":
            for _ in range(a):
                s.step()
                check(s)
        elif reqs:
            s.abort(reqs[a % len(reqs)].rid)
        check(s)
    run_until_idle(s, check, 2000)
    assert all(r.finished for r in reqs)
    assert s.allocator.num_free_pages == s.allocator.num_pages
    for r in reqs:
        if r.finish_reason["type"] == "length":
            assert len(r.output_ids) == r.params.max_new_tokens
        elif r.finish_reason["type"] == "stop":
            assert r.output_ids[-1] == EOS


def test_memory_pressure_preempts_newest_and_recomputes():
    """Pages for 2 full requests only: the third must wait or be preempted, and all finish."""
    runner = FakeRunner(num_slots=3, num_pages=8, page_size=4, context_length=16, chunk=64, seed=1)
    runner.config.eos_token_ids = ()
    s = Scheduler(runner, allocator=runner.allocator, chunked_prefill_size=64)
    reqs = [Req(rid=f"r{i}", prompt_ids=[1] * 6, params=SamplingParams(max_new_tokens=10)) for i in range(3)]
    for r in reqs:
        s.add(r)
    while s.has_work:
        s.step()
        check(s)
    assert all(len(r.output_ids) == 10 for r in reqs)
    assert s.num_preemptions > 0
    assert max(r.num_preemptions for r in reqs) == reqs[-1].num_preemptions  # the newest pays


def test_long_prefill_interleaves_with_decode():
    """While a long prompt is chunked, decoding requests get a step between its chunks."""
    runner = FakeRunner(num_slots=2, num_pages=64, page_size=4, context_length=200, chunk=8, seed=0)
    runner.config.eos_token_ids = ()
    s = Scheduler(runner, allocator=runner.allocator, chunked_prefill_size=8)
    s.add(Req(rid="short", prompt_ids=[1] * 3, params=SamplingParams(max_new_tokens=30)))
    s.step()  # prefill of the short request
    s.add(Req(rid="long", prompt_ids=[1] * 64, params=SamplingParams(max_new_tokens=1)))
    while s.has_work:
        s.step()
    modes = [m for m, _ in runner.batches]
    first_long = 1
    extend_steps = [i for i, m in enumerate(modes) if m is ForwardMode.EXTEND and i >= first_long]
    assert len(extend_steps) == 8  # 64 tokens in chunks of 8
    assert all(modes[i + 1] is ForwardMode.DECODE for i in extend_steps[:-1])


def test_requests_that_can_never_fit_are_rejected_with_the_cause():
    runner = FakeRunner(num_slots=2, num_pages=8, page_size=4, context_length=32, chunk=8, seed=0)
    s = Scheduler(runner, allocator=runner.allocator, chunked_prefill_size=8)
    for prompt, max_new, cause in [([1] * 32, 1, "context length"), ([1] * 20, 20, "exceeds the context"),
                                   ([], 1, "empty"), ([1, 99], 1, "outside the vocabulary")]:
        try:
            s.add(Req(rid="x", prompt_ids=prompt, params=SamplingParams(max_new_tokens=max_new)))
        except AdmissionError as e:
            assert cause in str(e)
        else:
            raise AssertionError(f"accepted {len(prompt)} tokens + {max_new}")
    assert not s.has_work


def test_overlapped_decode_chains_steps_and_frees_everything():
    runner = FakeRunner(num_slots=3, num_pages=30, page_size=4, context_length=40, chunk=64, seed=3)
    runner.config.eos_token_ids = ()
    s = Scheduler(runner, allocator=runner.allocator, chunked_prefill_size=64, overlap=True)
    reqs = [Req(rid=f"r{i}", prompt_ids=[1] * (3 + i), params=SamplingParams(max_new_tokens=8 + 3 * i))
            for i in range(3)]
    for r in reqs:
        s.add(r)
    while s.has_work:
        s.step()
        check(s)
    assert s.num_overlapped_steps > 5
    assert [len(r.output_ids) for r in reqs] == [8, 11, 14]
    assert s.allocator.num_free_pages == s.allocator.num_pages and s.allocator.num_free_slots == 3


def test_a_failed_overlapped_step_leaks_nothing():
    """A device error in the middle of a pipelined decode: after the engine loop's recovery (drop the
    step in flight, abort everything) every slot and page is free."""
    class FailingRunner(FakeRunner):
        launches = 0

        def launch_decode(self, items, prev=None, prev_rows=None, sample=True):
            self.launches += 1
            if self.launches == 6:
                raise RuntimeError("device error")
            return super().launch_decode(items, prev, prev_rows, sample)

    runner = FailingRunner(num_slots=3, num_pages=30, page_size=4, context_length=40, chunk=64, seed=5)
    runner.config.eos_token_ids = (3, 7, 11)  # frequent stops: slots held for the step in flight
    s = Scheduler(runner, allocator=runner.allocator, chunked_prefill_size=64, overlap=True)
    reqs = [Req(rid=f"r{i}", prompt_ids=[1] * (2 + i), params=SamplingParams(max_new_tokens=20)) for i in range(3)]
    for r in reqs:
        s.add(r)
    failed = False
    while s.has_work:
        try:
            s.step()
        except RuntimeError:
            failed = True
            s.drop_in_flight()  # what EngineLoop._fail_all does
            for r in list(s.running) + list(s.waiting):
                s.abort(r.rid)
        check(s)
    assert failed and all(r.finished for r in reqs)
    assert s.allocator.num_free_pages == s.allocator.num_pages and s.allocator.num_free_slots == 3


def test_overlapped_steps_with_a_grammar_sample_once_the_step_before_is_applied():
    """A grammar's mask needs the token of the step in flight, so a follow-up step with a constrained
    request runs its forward at launch and samples after the host has applied that step."""
    class AnyToken:  # a matcher that allows every token and never ends
        def accept(self, token):
            return True

        def is_terminated(self):
            return False

    runner = FakeRunner(num_slots=3, num_pages=30, page_size=4, context_length=40, chunk=64, seed=4)
    runner.config.eos_token_ids = ()
    s = Scheduler(runner, allocator=runner.allocator, chunked_prefill_size=64, overlap=True)
    reqs = [Req(rid="free", prompt_ids=[1] * 3, params=SamplingParams(max_new_tokens=9)),
            Req(rid="json", prompt_ids=[1] * 4, params=SamplingParams(max_new_tokens=9), grammar=AnyToken())]
    for r in reqs:
        s.add(r)
    run_until_idle(s, check, 200)
    assert s.num_overlapped_steps > 3 and runner.late_samples == s.num_overlapped_steps
    assert [len(r.output_ids) for r in reqs] == [9, 9]
