"""Prefix cache under random workloads, with a stand-in runner whose pools record *what* was
computed: each KV slot holds the token id at its position and each state slot holds (tokens
consumed, a hash of them). Every batch first checks that the pages and state a request starts
from are exactly those of its own tokens, so a wrong page, a stale snapshot or a missed copy
fails the test. After every step the allocator and the cache check their invariants."""

import random
from types import SimpleNamespace

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid_sgl.batch import ForwardMode
from hybrid_sgl.memory.allocator import Allocator
from hybrid_sgl.memory.kv_pool import KVPool
from hybrid_sgl.memory.prefix_cache import PrefixCache
from hybrid_sgl.memory.state_pool import StatePool
from hybrid_sgl.runner.model_runner import ModelRunner
from hybrid_sgl.runner.step_results import ItemResult
from hybrid_sgl.sampling_params import SamplingParams
from hybrid_sgl.scheduler.prefix_sharing import PrefixSharing
from hybrid_sgl.scheduler.request import Req, ReqStatus
from hybrid_sgl.scheduler.scheduler import AdmissionError, Scheduler
from tests.test_scheduler import run_until_idle

VOCAB, EOS, MOD = 50, 0, 1_000_003


def _hash(tokens: list[int]) -> int:
    h = 0
    for t in tokens:
        h = (h * 31 + t + 1) % MOD
    return h


class RecordingRunner:
    """A model whose 'KV' is the token id and whose 'state' is (count, hash) of the tokens so far."""

    def __init__(self, *, num_slots, num_pages, page_size, context_length, num_snapshots, seed, stateful=True):
        self.allocator = Allocator(num_slots=num_slots, num_pages=num_pages, page_size=page_size,
                                   max_pages_per_request=-(-context_length // page_size), device="cpu",
                                   num_snapshots=num_snapshots if stateful else 0)
        self.kv_pool = KVPool(num_layers=1, num_pages=num_pages, page_size=page_size, num_kv_heads=1, head_dim=1,
                              dtype=torch.float64, device="cpu")
        self.state_pool = StatePool(num_layers=1, num_slots=num_slots, conv_shape=(1, 1), conv_dtype=torch.float64,
                                    ssm_shape=(2,), ssm_dtype=torch.float64, device="cpu",
                                    num_snapshots=num_snapshots) if stateful else None
        self.context_length = context_length
        self.config = SimpleNamespace(vocab_size=VOCAB, eos_token_ids=(EOS,))
        self.rng = random.Random(seed)
        self.computed = 0  # tokens computed, over all batches

    def _forward(self, req: Req, start: int, tokens: list[int], snapshots=()) -> None:
        a, ps = self.allocator, self.allocator.page_size
        pages = a.slot_pages[req.slot]
        assert len(pages) * ps >= start + len(tokens)
        before = req.fill_ids[:start]
        for pos, tok in enumerate(before):  # the KV the request reads is its own tokens'
            assert self.kv_pool.k[0, pages[pos // ps], pos % ps, 0, 0].item() == tok, (req.rid, pos)
        if self.state_pool is not None and start > 0:
            count, h = self.state_pool.ssm[0, req.slot].tolist()
            assert (int(count), int(h)) == (start, _hash(before)), (req.rid, start, count)
        for i, tok in enumerate(tokens):
            pos = start + i
            self.kv_pool.k[0, pages[pos // ps], pos % ps, 0, 0] = tok
        if self.state_pool is not None:
            for pos, index in snapshots:  # the state inside the run, copied where the step was told to
                assert start < pos < start + len(tokens)
                self.state_pool.ssm[0, index] = torch.tensor([pos, _hash(req.fill_ids[:pos])], dtype=torch.float64)
            self.state_pool.ssm[0, req.slot] = torch.tensor([start + len(tokens), _hash(before + tokens)],
                                                            dtype=torch.float64)
        self.computed += len(tokens)

    def run(self, mode, items, while_running=None):
        slots = [it.req.slot for it in items]
        assert len(set(slots)) == len(slots) and None not in slots
        for it in items:
            assert it.req.status is ReqStatus.RUNNING and it.start == it.req.num_computed
            self._forward(it.req, it.start, it.req.token_slice(it.start, it.end), it.snapshots)
        if while_running is not None:  # as on a device: after the step's writes are queued, before its results
            while_running()
        return [ItemResult(next_token=self.rng.randrange(VOCAB) if it.sample else None) for it in items]

    can_overlap = staticmethod(ModelRunner.can_overlap)

    def launch_decode(self, items, prev=None, prev_rows=None, sample=True):
        prev_rows = prev_rows or [-1] * len(items)
        tokens = [self.rng.randrange(VOCAB) for _ in items]
        for it, j in zip(items, prev_rows):
            req = it.req
            token = prev.tokens[j] if j >= 0 else req.token_slice(it.start, it.end)[0]
            if j >= 0:  # the previous step's token is not in output_ids yet: check and write around it
                saved = list(req.output_ids)
                req.output_ids.append(token)
                self._forward(req, it.start, [token])
                req.output_ids[:] = saved
            else:
                self._forward(req, it.start, [token])
        return SimpleNamespace(items=items, deferred=[], tokens=tokens,
                               results=lambda: [ItemResult(next_token=t) for t in tokens])


def make(overlap=False, stateful=True, **kw):
    runner = RecordingRunner(**kw, stateful=stateful)
    cache = PrefixCache(allocator=runner.allocator, state_pool=runner.state_pool, kv_pool=runner.kv_pool)
    sharing = PrefixSharing(cache, snapshot_interval=12, min_branch_tokens=4)
    return runner, Scheduler(runner, allocator=runner.allocator, chunked_prefill_size=16, overlap=overlap,
                             sharing=sharing)


def check(s: Scheduler) -> None:
    s.check_integrity()
    slots = [r.slot for r in s.running + s.pipeline.holders()]
    assert None not in slots and len(set(slots)) == len(slots)
    assert all(r.slot is None and r.cache_node is None for r in s.waiting)


events = st.lists(st.one_of(
    st.tuples(st.just("arrive"), st.integers(0, 3), st.integers(1, 30), st.integers(0, 12)),
    st.tuples(st.just("step"), st.integers(1, 4), st.just(0), st.just(0)),
    st.tuples(st.just("abort"), st.integers(0, 100), st.just(0), st.just(0)),
    st.tuples(st.just("flush"), st.just(0), st.just(0), st.just(0)),
), min_size=1, max_size=50)


@settings(max_examples=150, deadline=None)
@given(events, st.integers(0, 10_000), st.booleans(), st.booleans(), st.sampled_from([2, 6]))
def test_random_shared_prefix_workloads_reuse_only_what_is_theirs(sequence, seed, overlap, stateful, snapshots):
    runner, s = make(num_slots=3, num_pages=22, page_size=4, context_length=48, num_snapshots=snapshots,
                     seed=seed, overlap=overlap, stateful=stateful)
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, VOCAB) for _ in range(20)] for _ in range(4)]
    reqs: list[Req] = []
    for kind, a, b, c in sequence:
        if kind == "arrive":
            prompt = prefixes[a][:rng.randrange(0, 21)] + [rng.randrange(1, VOCAB) for _ in range(b - b // 2)]
            req = Req(rid=f"r{len(reqs)}", prompt_ids=prompt, params=SamplingParams(max_new_tokens=c))
            try:
                s.add(req)
                reqs.append(req)
            except AdmissionError:
                assert len(prompt) + c > runner.context_length
        elif kind == "step":
            for _ in range(a):
                s.step()
                check(s)
        elif kind == "abort" and reqs:
            s.abort(reqs[a % len(reqs)].rid)
        elif kind == "flush":
            assert s.flush_cache() == (not s.has_work)
        check(s)
    run_until_idle(s, check, 3000)
    assert all(r.finished for r in reqs)
    assert all(0 <= r.cached_tokens < max(len(r.prompt_ids), 1) for r in reqs)
    assert s.flush_cache()
    check(s)
    a = s.allocator
    assert a.num_free_pages == a.num_pages and a.num_free_slots == a.num_slots
    assert a.num_free_snapshots == a.num_snapshots


def _serve(s: Scheduler, reqs: list[Req]) -> None:
    for r in reqs:
        s.add(r)
    while s.has_work:
        s.step()
        check(s)


def _req(rid: str, prompt: list[int], max_new: int = 3) -> Req:
    return Req(rid=rid, prompt_ids=prompt, params=SamplingParams(max_new_tokens=max_new, ignore_eos=True))


def test_cached_tokens_follow_the_design():
    """page 4, branch points from 4 shared tokens, snapshots every 12 tokens of a prompt."""
    runner, s = make(num_slots=4, num_pages=64, page_size=4, context_length=64, num_snapshots=16, seed=0)
    base = list(range(1, 31))  # 30 tokens
    first = _req("a", base + [40, 41])
    _serve(s, [first])
    assert first.cached_tokens == 0
    # "a" left snapshots at its chunk ends 12 and 24 (the interval), its prompt end 32 and its end 34.
    second = _req("b", base + [42, 43, 44])  # follows a's pages to 28 (page 7 differs): snapshot 24
    _serve(s, [second])
    assert second.cached_tokens == 24
    third = _req("b2", base + [46])  # b stopped a chunk at 28, where it left a's pages: snapshot 28
    _serve(s, [third])
    assert third.cached_tokens == 28
    turn2 = _req("c", first.prompt_ids + first.output_ids + [45])  # next turn: the finish snapshot (34)
    _serve(s, [turn2])
    assert turn2.cached_tokens == len(first.prompt_ids) + len(first.output_ids) - 1
    # two new prompts sharing 21 tokens arrive together: one computes 21 tokens and stops there, the
    # other waits one step and starts from the snapshot at 21 (a position inside a page)
    shared = [7] * 21
    x, y = _req("x", shared + [1, 2, 3]), _req("y", shared + [4, 5])
    computed = runner.computed
    _serve(s, [x, y])
    assert (x.cached_tokens, y.cached_tokens) == (0, 21)
    assert runner.computed - computed == 24 + 2 + (3 - 1) * 2  # prompts once, then decode tokens


def test_n_samples_of_one_prompt_prefill_it_once():
    runner, s = make(num_slots=4, num_pages=64, page_size=4, context_length=64, num_snapshots=16, seed=0)
    prompt = list(range(1, 23))  # 22 tokens: s0 computes [0, 12) (interval), [12, 21) (branch), [21, 22)
    reqs = [_req(f"s{j}", prompt, max_new=1) for j in range(4)]
    _serve(s, reqs)
    assert [r.cached_tokens for r in reqs] == [0, 21, 21, 21]
    assert runner.computed == 22 + 3  # the prompt once, then its last token once per other sample


def test_preempted_request_recomputes_from_the_cache():
    runner, s = make(num_slots=3, num_pages=12, page_size=4, context_length=40, num_snapshots=8, seed=2)
    reqs = [_req(f"r{i}", [i + 1] * 10, max_new=12) for i in range(3)]
    _serve(s, reqs)
    assert s.num_preemptions > 0
    # a preempted request resumed from its own snapshot: fewer tokens computed than a full recompute
    total = sum(len(r.prompt_ids) + len(r.output_ids) - 1 for r in reqs)
    assert runner.computed < total + sum(len(r.prompt_ids) + len(r.output_ids) for r in reqs if r.num_preemptions)
    assert s.flush_cache()
    check(s)


def test_an_extend_step_caches_its_chunks_while_the_device_computes_it():
    """The snapshots inside an extend step's chunks and the chunk ends reach the cache between the step's
    launch and the reading of its results (ModelRunner.run's while_running), not after."""
    runner, s = make(num_slots=2, num_pages=32, page_size=4, context_length=64, num_snapshots=8, seed=1)
    cache = s.sharing.cache
    seen = []
    step = runner.run

    def run(mode, items, while_running=None):
        def inside():
            before = cache.snapshots_taken
            while_running()
            seen.append((mode, cache.snapshots_taken - before, [it.req.num_computed == it.start for it in items]))
        return step(mode, items, inside if while_running is not None else None)

    runner.run = run
    _serve(s, [_req("a", list(range(1, 31)))])  # 30 tokens in chunks of 16: cuts at 12 and 24, chunk end 16
    extend = [(taken, unapplied) for mode, taken, unapplied in seen if mode is ForwardMode.EXTEND]
    assert extend and sum(taken for taken, _ in extend) >= 3  # 12, 16 (the chunk's end), 24, 29 (last but one)
    assert all(all(unapplied) for _, unapplied in extend)  # results not applied yet when the cache took them
