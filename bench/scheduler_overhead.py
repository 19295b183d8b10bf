"""Host time of the scheduler alone (no model: a null runner returns random tokens), with the prefix
cache on and off, on a multi-turn chat workload: U users, each turn sends the conversation so far
plus ~200 new tokens and generates 128. Runs anywhere (CPU); what it measures is the Python cost of
scheduling, lookups, inserts and snapshot bookkeeping per step, which the GPU cannot hide in
prefill steps.

    PYTHONPATH=$PWD python bench/scheduler_overhead.py --users 64 --turns 8
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hybrid_sgl.memory.allocator import Allocator  # noqa: E402
from hybrid_sgl.memory.prefix_cache import PrefixCache  # noqa: E402
from hybrid_sgl.runner.model_runner import ItemResult, ModelRunner  # noqa: E402
from hybrid_sgl.sampling_params import SamplingParams  # noqa: E402
from hybrid_sgl.scheduler.prefix_sharing import PrefixSharing  # noqa: E402
from hybrid_sgl.scheduler.request import Req  # noqa: E402
from hybrid_sgl.scheduler.scheduler import Scheduler  # noqa: E402

VOCAB = 50_000


class NullRunner:
    """Pools without tensors worth the name; the forward is skipped."""

    def __init__(self, slots: int, pages: int, snapshots: int, seed: int):
        self.allocator = Allocator(num_slots=slots, num_pages=pages, page_size=16, max_pages_per_request=1024,
                                   device="cpu", num_snapshots=snapshots)
        self.context_length = 16384
        self.config = SimpleNamespace(vocab_size=VOCAB, eos_token_ids=())
        self.rng = random.Random(seed)

    def run(self, mode, items):
        return [ItemResult(next_token=self.rng.randrange(VOCAB) if it.sample else None) for it in items]

    can_overlap = staticmethod(ModelRunner.can_overlap)

    def launch_decode(self, items, prev=None, prev_rows=None):
        tokens = [self.rng.randrange(VOCAB) for _ in items]
        return SimpleNamespace(items=items, deferred=[], logits=None,
                               results=lambda: [ItemResult(next_token=t) for t in tokens])


class _NoCopies:
    """Stand-in pools for the cache: device copies are not what this measures."""

    def copy_slot(self, *args):
        pass

    def copy_page(self, *args):
        pass


def run(users: int, turns: int, cache: bool) -> dict:
    runner = NullRunner(slots=256, pages=200_000, snapshots=700 if cache else 0, seed=0)
    sharing = None
    if cache:
        pc = PrefixCache(allocator=runner.allocator, state_pool=_NoCopies(), kv_pool=_NoCopies())
        sharing = PrefixSharing(pc, snapshot_interval=2048, min_branch_tokens=64)
    s = Scheduler(runner, chunked_prefill_size=8192, sharing=sharing)
    rng = random.Random(1)
    history = [[] for _ in range(users)]
    steps, host = 0, 0.0
    for _ in range(turns):
        reqs = []
        for u in range(users):
            history[u] = history[u] + [rng.randrange(VOCAB) for _ in range(rng.randrange(150, 251))]
            req = Req(rid=f"u{u}-{len(history[u])}", prompt_ids=list(history[u]),
                      params=SamplingParams(max_new_tokens=128, ignore_eos=True))
            s.add(req)
            reqs.append(req)
        while s.has_work:
            t = time.perf_counter()
            s.step()
            host += time.perf_counter() - t
            steps += 1
        for u, req in enumerate(reqs):
            history[u] = history[u] + req.output_ids
    return {"steps": steps, "host_s": host, "ms_per_step": 1e3 * host / steps}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--users", type=int, default=64)
    p.add_argument("--turns", type=int, default=8)
    args = p.parse_args(argv)
    for cache in (False, True):
        r = run(args.users, args.turns, cache)
        print(f"{'cache' if cache else 'no cache':9s} steps {r['steps']:5d}  host {r['host_s']:.2f} s  "
              f"{r['ms_per_step']:.3f} ms/step")


if __name__ == "__main__":
    main()
