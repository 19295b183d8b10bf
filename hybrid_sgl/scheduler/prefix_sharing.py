"""How the scheduler uses the prefix cache: lookups at admission, where prompt chunks end, who
waits for whom, and what goes into the cache when.

A recurrent layer's state can only be restored where a copy of it was taken. Copies are taken
at the end of every prompt chunk and of every finished or preempted request, and inside a prompt
chunk, where the recurrent prefill kernels write the state at each cut into a snapshot slot
(ForwardBatch.snap_pos / snap_slots; a cut costs the state's bytes and no host time), at:
  - *branch points*: where the prompt leaves the cached pages (the pages are there, the state is
    not), or where it stops sharing tokens with a request still waiting (a shared system prompt,
    the n samples of one prompt, a DSL fork). The waiting request is held back until the running
    one has passed that point, then finds a snapshot there. A branch point is taken when at
    least `min_branch_tokens` would be shared, or when one prompt is the other's prefix (the n
    samples of one prompt, a resent prompt), however short;
  - the prompt's last position but one, so that the same prompt sent again restores all of it
    but the one token it must compute;
  - fixed positions (`cut_points`), so that a prefix shared later finds a snapshot close to
    where the prompts part: by default 64, 96, 128, 192, then four a doubling (256, 320, 384,
    448, 512, 640, ...), which puts one at >= 80 % of any shared prefix of 256 tokens or more;
    with --snapshot-interval N every N tokens instead.
A row takes at most MAX_CUTS cuts a step: branch points and the last position first, then the
fixed positions deepest first.

PrefixSharing implements sharing.BasePrefixSharing; prefix_sharing_for gives it, or the null
NoPrefixSharing under --disable-radix-cache.
"""

from __future__ import annotations

from collections.abc import Iterable

from hybrid_sgl.batch import MAX_CUTS
from hybrid_sgl.memory.allocator import Allocator
from hybrid_sgl.memory.pools import Pools
from hybrid_sgl.memory.prefix_cache import Match, PrefixCache
from hybrid_sgl.runner.model_runner import BatchItem
from hybrid_sgl.scheduler.request import Req
from hybrid_sgl.scheduler.sharing import BasePrefixSharing, NoPrefixSharing

# The default cut positions: from FIRST_CUT, two a doubling up to DENSE_FROM, then four a doubling.
# Eight cuts in a 2k prefill cost 0.3 ms of its 53 ms on the 9B shape (H100, bench/results/2026-12-05).
FIRST_CUT, DENSE_FROM = 64, 256
# A partial share shorter than this is not worth holding a request back a step for: computing 64 more
# tokens inside a batch costs about 1.6 ms of device time on the 9B shape, a step of waiting 7-50 ms.
MIN_BRANCH_TOKENS = 64
LPM_MAX_WAITING = 128  # longest-prefix-first ordering costs a lookup per waiting request; above this, FCFS
PEERS_CHECKED = 64  # waiting requests compared with a prefilling one for branch points


class PrefixSharing(BasePrefixSharing):
    def __init__(self, cache: PrefixCache, *, snapshot_interval: int | None, min_branch_tokens: int,
                 policy: str = "lpm"):
        self.cache = cache
        self.allocator: Allocator = cache.allocator
        self.interval = snapshot_interval
        self.min_branch = min_branch_tokens
        self.policy = policy

    # ---- admission ---------------------------------------------------------------------------------
    def lookup(self, req: Req) -> Match:
        """The reusable prefix of req's tokens; at least one token is always left to compute, and no
        prompt position whose logprob is asked for is skipped."""
        limit = req.seq_len - 1
        if req.return_logprob:
            limit = min(limit, max(0, req.input_logprob_pos - 1))
        return self.cache.match(req.fill_ids, limit)

    def order(self, waiting: Iterable[Req]) -> list[Req]:
        """Waiting requests in admission order: longest cached prefix first (lpm), else arrival."""
        reqs = list(waiting)
        if self.policy != "lpm" or len(reqs) > LPM_MAX_WAITING:
            return reqs
        return sorted(reqs, key=lambda r: (-self.lookup(r).pos, r.arrival))

    def held_back(self, req: Req, hit: int, prefilling: Iterable[Req]) -> bool:
        """Whether req should wait for a running request that is computing a longer shared prefix: one
        that has not reached the branch point yet, when waiting saves min_branch_tokens or the other is
        already past where req would start (req would only redo its work)."""
        for other in prefilling:
            if other is req:
                continue
            b = self.branch_point(req, other)
            if b > max(hit, other.num_computed) and (b - hit >= self.min_branch or other.num_computed >= hit):
                return True
        return False

    def admit(self, req: Req, m: Match, slot: int) -> None:
        """Give req's new slot the matched prefix (lock it first with `lock`)."""
        try:
            self.cache.restore(m, slot)
        finally:
            self.cache.pin(m, -1)
        req.num_computed = req.restored_at = m.pos
        if req.num_preemptions == 0:
            req.cached_tokens = m.pos
            self.cache.lookup_tokens += len(req.prompt_ids)
            self.cache.hit_tokens += m.pos
        req.cache_node = m.node

    def plan_branch(self, req: Req, m: Match) -> None:
        """Where req leaves what the cache can restore: cached pages (or state past the last prompt
        token) go on without a snapshot. A snapshot is taken there, so the next request finds one."""
        branch = min(m.matched, req.seq_len - 1)
        req.branch_pos = branch if branch > m.pos else 0

    def lock(self, m: Match) -> None:
        self.cache.lock(m.node)
        self.cache.pin(m, +1)

    def unlock(self, m: Match) -> None:
        self.cache.pin(m, -1)
        self.cache.release(m.node)

    # ---- snapshots inside a chunk -------------------------------------------------------------------
    def plan_snapshots(self, items: list[BatchItem], waiting: Iterable[Req]) -> None:
        """Give each prompt chunk its snapshot points (positions strictly inside it) and a snapshot
        slot for each, while slots can be had for what a point would save. A branch point, which another
        request is known to share, saves that request everything past the snapshot its own row started
        from (the fixed points of the same pass above it are no help to it once they are evicted)."""
        waiting = list(waiting)[:PEERS_CHECKED]
        for item in items:
            req = item.req
            branches = self.branch_points(req, item.start, item.end, waiting)
            points = self.snapshot_points(req, item.start, item.end, branches)
            req.shared_cuts = {p: p - req.restored_at for p in points if p in branches}
            for pos, before in zip(points, [item.start] + points):
                index = self.cache.take_snapshot_slot(req.shared_cuts.get(pos, pos - before))
                if index is not None:
                    item.snapshots.append((pos, index))

    def branch_points(self, req: Req, start: int, end: int, waiting: list[Req]) -> set[int]:
        """Positions in (start, end) where req's prompt and a cached or waiting one part."""
        wanted = {req.branch_pos} | {self.branch_point(req, other) for other in waiting if other is not req}
        return {p for p in wanted if start < p < end}

    def snapshot_points(self, req: Req, start: int, end: int, branches: set[int]) -> list[int]:
        """Cut positions in (start, end), ascending, at most MAX_CUTS: the branch points and the last
        prompt position but one first, then the fixed positions, deepest first."""
        points = set(branches) | {p for p in (len(req.prompt_ids) - 1,) if start < p < end}
        fixed = [p for p in cut_points(start, end, self.interval) if p not in points]
        points.update(fixed[::-1][:max(0, MAX_CUTS - len(points))])
        return sorted(points)[-MAX_CUTS:]

    def snapshots_done(self, item: BatchItem) -> None:
        """The step ran: its snapshots go into the cache with their prefixes."""
        req = item.req
        self.cache.insert_cuts(req.fill_ids, self.allocator.slot_pages[req.slot],
                               [(pos, index, req.shared_cuts.get(pos)) for pos, index in item.snapshots])
        item.snapshots, req.shared_cuts = [], {}

    def drop_snapshots(self, items: list[BatchItem]) -> None:
        """The step failed: give its snapshot slots back."""
        for item in items:
            for _, index in item.snapshots:
                self.allocator.free_snapshot(index)
            item.snapshots = []

    def branch_point(self, a: Req, b: Req) -> int:
        """Deepest prompt position whose state both requests could use: their prompts' common prefix,
        leaving each at least one token to compute; 0 unless it reaches min_branch_tokens or one
        prompt is the other's prefix (checked first on the prompts' first min_branch_tokens tokens,
        so unrelated requests cost a compare)."""
        key_a, key_b = self._head(a), self._head(b)
        n = min(len(key_a), len(key_b))
        if n == 0 or key_a[:n] != key_b[:n]:
            return 0
        shared = _common_prefix(a.prompt_ids, b.prompt_ids)
        if shared < self.min_branch and shared < min(len(a.prompt_ids), len(b.prompt_ids)):
            return 0
        return min(shared, a.seq_len - 1, b.seq_len - 1)

    def _head(self, req: Req) -> tuple[int, ...]:
        """The prompt's first min_branch_tokens tokens (all of a shorter one), kept on the request."""
        if req.prompt_head is None:
            req.prompt_head = tuple(req.prompt_ids[:self.min_branch])
        return req.prompt_head

    def chunk_done(self, req: Req, end: int) -> None:
        """req's step computes a prompt chunk up to `end`: cache the prefix and the state there (its copy
        queued behind the step), lock that, drop the old lock."""
        if req.branch_pos <= end:
            req.branch_pos = 0
        old = req.cache_node
        req.cache_node = self.cache.insert(req.fill_ids[:end], self.allocator.slot_pages[req.slot],
                                           req.slot, keep=True)
        if old is not None:
            self.cache.release(old)

    # ---- release -----------------------------------------------------------------------------------
    def cache_sequence(self, req: Req, num_tokens: int | None) -> None:
        """req is about to give up its slot, whose state is after fill_ids[:num_tokens]: that prefix goes
        into the cache (the caller has dropped req's lock already, see drop_lock)."""
        if num_tokens is not None and num_tokens > 0 and req.slot is not None:
            self.cache.insert(req.fill_ids[:num_tokens], self.allocator.slot_pages[req.slot], req.slot, keep=False)

    def drop_lock(self, req: Req) -> None:
        if req.cache_node is not None:
            self.cache.release(req.cache_node)
            req.cache_node = None

    def ensure_free_pages(self, n: int) -> bool:
        return self.allocator.num_free_pages >= n or self.cache.evict_pages(n)

    # ---- the whole cache ----------------------------------------------------------------------------
    def flush(self) -> None:
        self.cache.flush()

    def stats(self) -> dict:
        return self.cache.stats()

    def check_integrity(self, holders: list[Req]) -> None:
        """The cache's own invariants, its root lock equals the requests that hold a node, and the
        allocator's invariants with the cache's page references and snapshot slots counted."""
        self.cache.check_integrity()
        locked = sum(1 for r in holders if r.cache_node is not None)
        assert self.cache.root.lock == locked, (
            f"prefix-cache root lock {self.cache.root.lock} but {locked} requests hold a node")
        self.allocator.check_integrity(cache_pages=self.cache.held_pages(), cache_snapshots=self.cache.held_snapshots())


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:
        return 0
    if a[:n] == b[:n]:
        return n
    lo, hi = 1, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def cut_points(start: int, end: int, interval: int | None) -> list[int]:
    """The fixed cut positions in (start, end): every `interval` tokens, or by default 64, 96, 128,
    192 (two a doubling), then 256, 320, 384, 448, 512, 640, ... (four a doubling)."""
    if interval:
        return list(range((start // interval + 1) * interval, end, interval))
    out, base = [], FIRST_CUT
    while base < end:
        steps = 2 if base < DENSE_FROM else 4
        out.extend(p for k in range(steps) if start < (p := base + k * base // steps) < end)
        base *= 2
    return out


def describe_placement(interval: int | None) -> str:
    """The snapshot placement in force, for /server_info."""
    if interval:
        return f"every {interval} tokens"
    return (f"{FIRST_CUT}, {FIRST_CUT * 3 // 2}, ... two a doubling to {DENSE_FROM}, then four a doubling "
            f"({', '.join(map(str, cut_points(DENSE_FROM - 1, 4 * DENSE_FROM + 1, None)))}, ...)")


def prefix_sharing_for(pools: Pools, *, disable: bool, snapshot_interval: int | None,
                       policy: str) -> BasePrefixSharing:
    """The prefix cache over `pools`, or NoPrefixSharing when it is disabled."""
    if disable:
        return NoPrefixSharing(pools.allocator)
    cache = PrefixCache(allocator=pools.allocator, state_pool=pools.state_pool, kv_pool=pools.kv_pool)
    if snapshot_interval is not None and snapshot_interval < 1:
        raise ValueError(f"--snapshot-interval must be a positive number of tokens, got {snapshot_interval}")
    return PrefixSharing(cache, snapshot_interval=snapshot_interval, min_branch_tokens=MIN_BRANCH_TOKENS,
                         policy=policy)
