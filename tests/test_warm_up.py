"""The eager-step warm-up (runner/warm_up.py): which steps it plans, that running them on the live pools
gives every slot, page and snapshot row back and changes no later result, and the compile watch."""

import pytest

from hybrid_sgl import Engine
from hybrid_sgl.runner.warm_up import CompileWatch, eager_warm_up_plans, warm_up_eager_steps
from tests.test_hf_parity import prompt_of


def test_plans_cover_both_size_classes_with_one_and_several_rows():
    plans = eager_warm_up_plans(max_tokens=8192, graph_tokens=2048, page_size=16, num_slots=256,
                                context_length=8192)
    totals = [(len(lens), sum(lens), max(prefix)) for prefix, lens in plans]
    assert {n % 16 == 0 for _, n, _ in totals} == {True, False}
    assert {rows for rows, _, _ in totals} == {1, 3, 16}
    assert {p > 0 for _, _, p in totals} == {True, False}
    assert all(p + n <= 8192 for prefix, lens in plans for p, n in zip(prefix, lens))
    assert all(p % 16 for prefix, _ in plans for p in prefix if p)  # a prefix that ends inside a page


def test_no_eager_steps_when_the_graphs_cover_the_chunk():
    assert eager_warm_up_plans(max_tokens=2048, graph_tokens=2048, page_size=16, num_slots=256,
                               context_length=8192) == []
    plans = eager_warm_up_plans(8192, 2048, 16, num_slots=4, context_length=8192)
    assert {len(prefix) for prefix, _ in plans} == {1, 3}
    assert {lens[0] for prefix, lens in plans if len(lens) == 1 and not prefix[0]} >= {2049, 4096, 4097, 8192}


def test_warm_up_gives_the_pools_back_and_changes_no_result(tiny_checkpoint):
    path = tiny_checkpoint("qwen3_5")
    params = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
    with Engine(model_path=path, device="cpu", dtype="float32", chunked_prefill_size=64,
                log_level="warning") as engine:
        ids = prompt_of(70, 3, engine.runner.config.vocab_size)
        before = engine.generate(input_ids=ids, sampling_params=params)["output_ids"]
        engine.flush_cache()
        a = engine.runner.allocator
        free = (a.num_free_slots, a.num_free_pages, a.num_free_snapshots)
        assert warm_up_eager_steps(engine.runner) == len(eager_warm_up_plans(64, 0, 16, 32, 2048)) + 4
        assert (a.num_free_slots, a.num_free_pages, a.num_free_snapshots) == free
        engine.check_integrity()
        after = engine.generate(input_ids=ids, sampling_params=params)["output_ids"]
    assert after == before


def test_compile_watch_chains_and_restores_the_hook():
    knobs = pytest.importorskip("triton").knobs.runtime
    seen = []
    previous = knobs.jit_cache_hook
    knobs.jit_cache_hook = lambda *a, **k: seen.append(k.get("repr"))
    try:
        watch = CompileWatch()
        knobs.jit_cache_hook(repr="k1[...]")
        watch.serving()
        knobs.jit_cache_hook(repr="k2[...]", fn=type("F", (), {"name": "k2"})(), compile={"num_warps": 4})
        watch.close()
        assert (watch.total, seen) == (2, ["k1[...]", "k2[...]"])
        assert len(watch.after_warm_up) == 1 and watch.after_warm_up[0].startswith("k2 {'num_warps': 4")
        assert knobs.jit_cache_hook is not watch._hook
    finally:
        knobs.jit_cache_hook = previous
