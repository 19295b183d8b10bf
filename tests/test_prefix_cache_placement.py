"""The default snapshot placement on every family: what the second request finds (cached_tokens
as the placement predicts) and that reuse changes no token or logprob. The cases are those users of
other engines see miss: the same prompt sent twice, two prompts sharing 160 or 600 tokens, n = 4
on a prompt under 64 tokens, and a third request after the second."""

import pytest

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.memory.prefix_cache import PrefixCache
from hybrid_sgl.runner.model_runner import ModelRunner
from hybrid_sgl.scheduler.prefix_sharing import MIN_BRANCH_TOKENS, PrefixSharing, cut_points
from hybrid_sgl.scheduler.scheduler import Scheduler
from hybrid_sgl.server_args import ServerArgs
from tests.test_prefix_cache_families import FAMILIES, PAGE, _req, _serve, _tokens, assert_same_outputs


def _scenario(s: Scheduler) -> dict:
    out = {}
    prompt = _tokens(21, 262)
    out["resent"] = [_serve(s, [_req("r0", prompt)])[0], _serve(s, [_req("r1", prompt)])[0]]
    stem = _tokens(22, 160)
    out["share160"] = [_serve(s, [_req(f"a{j}", stem + _tokens(23 + j, 20))])[0] for j in range(2)]
    system = _tokens(25, 600)
    out["share600"] = [_serve(s, [_req(f"b{j}", system + _tokens(26 + j, 30))])[0] for j in range(3)]
    short = _tokens(29, 34)
    device = s.runner.device
    out["n4short"] = _serve(s, [_req(f"n{j}", short, temperature=0.8, seed=7 + j, device=device)
                                for j in range(4)])
    return out


@pytest.fixture(scope="module", params=FAMILIES)
def runs(request, tiny_checkpoint):
    path = tiny_checkpoint(request.param)
    args = ServerArgs(model_path=path, device="cpu", dtype="float32", page_size=PAGE,
                      max_running_requests=8).resolved()
    runner = ModelRunner(args, ModelConfig.from_hf(path))
    plain = _scenario(Scheduler(runner, allocator=runner.allocator, chunked_prefill_size=256))
    cache = PrefixCache(allocator=runner.allocator, state_pool=runner.state_pool, kv_pool=runner.kv_pool)
    sharing = PrefixSharing(cache, snapshot_interval=None, min_branch_tokens=MIN_BRANCH_TOKENS)
    s = Scheduler(runner, allocator=runner.allocator, chunked_prefill_size=256, sharing=sharing)
    cached = _scenario(s)
    stats = s.cache_stats()
    assert s.flush_cache()
    s.check_integrity()
    return plain, cached, stats


@pytest.mark.parametrize("case", ["resent", "share160", "share600", "n4short"])
def test_reuse_changes_no_token_and_no_logprob(runs, case):
    plain, cached, _ = runs
    assert_same_outputs(plain[case], cached[case])


def test_second_requests_hit_where_the_placement_predicts(runs):
    _, c, stats = runs
    # the same 262-token prompt again: the snapshot at its last position but one
    assert [r.cached_tokens for r in c["resent"]] == [0, 261]
    # 160 shared tokens: the deepest default cut below 160 is 128 (80 %)
    assert [r.cached_tokens for r in c["share160"]] == [0, 128]
    # 600 shared: the cut at 512 (85 %) for the second; the third restores where the second left the
    # cached pages (its branch point): the last whole page both share, 592
    assert [r.cached_tokens for r in c["share600"]] == [0, 512, 600 // PAGE * PAGE]
    # four samples of a 34-token prompt: prefilled once, the other three restore position 33
    assert [r.cached_tokens for r in c["n4short"]] == [0, 33, 33, 33]
    assert stats["snapshots_hit"] >= 6 and stats["snapshots_taken"] > stats["snapshots_hit"]


def test_default_cut_points_put_one_at_four_fifths_of_any_prefix_from_256():
    for shared in range(256, 20000, 7):
        below = [p for p in cut_points(0, shared + 1, None)]
        assert below[-1] >= 0.8 * shared, shared
    assert cut_points(0, 300, None) == [64, 96, 128, 192, 256]
    assert cut_points(96, 256, 100) == [100, 200]


def test_a_branch_point_snapshot_is_worth_all_its_row_computed(tiny_checkpoint):
    """Two requests sharing a 600-token system prompt, sent together: the first computes it, with a cut at
    the branch point (600) and fixed cuts above it (512, ...). The branch snapshot is taken at the worth of
    the 600 tokens the second request is spared, not the 88 over the cut at 512 (which is evicted long
    before it is)."""
    path = tiny_checkpoint("qwen3_5")
    args = ServerArgs(model_path=path, device="cpu", dtype="float32", page_size=PAGE,
                      max_running_requests=8).resolved()
    runner = ModelRunner(args, ModelConfig.from_hf(path))
    cache = PrefixCache(allocator=runner.allocator, state_pool=runner.state_pool, kv_pool=runner.kv_pool)
    taken, add = {}, cache._add_snapshot

    def recording_add(node, pos, tail, tail_page, slot, filled, saves):
        taken.setdefault(pos, saves)
        return add(node, pos, tail, tail_page, slot, filled, saves)

    cache._add_snapshot = recording_add
    s = Scheduler(runner, allocator=runner.allocator, chunked_prefill_size=1024,
                  sharing=PrefixSharing(cache, snapshot_interval=None, min_branch_tokens=MIN_BRANCH_TOKENS))
    system = _tokens(41, 600)
    first, second = _serve(s, [_req("p0", system + _tokens(42, 30)), _req("p1", system + _tokens(43, 30))])
    assert (first.cached_tokens, second.cached_tokens) == (0, 600)
    assert taken[512] == 512 - 448  # a fixed cut: over the one at 448 of the same pass
    assert taken[600] == 600  # the branch point: everything its row computed
    s.check_integrity()
