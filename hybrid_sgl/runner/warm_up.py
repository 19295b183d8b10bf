"""Warm-up before serving (the eager steps, the sampler), and a watch on kernels compiled after it.

Triton compiles a kernel once per specialization of its arguments: each integer argument is classed
as 1, a multiple of 16 or other, each pointer as 16-byte aligned or not, and every constexpr value
is a key of its own. An eager extend step (larger than the extend graphs) of several rows, or of
rows continuing from a cached prefix, or of a token count that is no multiple of 16, can meet a
specialization that the memory-profile step (one row of the largest chunk, from position 0) did not,
and its first request then waits seconds for the compiler. `warm_up_eager_steps` runs one step of
each such kind on the live pools before serving and gives everything back; `CompileWatch` logs any
kernel compiled after that, so a shape the warm-up misses shows in the log with its specialization.
"""

from __future__ import annotations

import itertools
import logging

import torch

from hybrid_sgl.batch import ForwardMode, StepPlan
from hybrid_sgl.runner.sampler import Sampler
from hybrid_sgl.sampling_params import SamplingParams
from hybrid_sgl.scheduler.request import Req
from triton_kernels.host_math import next_power_of_2

logger = logging.getLogger(__name__)

WARM_UP_ROWS = (1, 3, 16)  # rows of the warm-up steps: Triton's classes of an integer (1, other, 16k)


class CompileWatch:
    """Counts Triton compilations in this process (a chained `triton.knobs.runtime.jit_cache_hook`, called
    at each in-process cache miss) and logs each one made after `serving()` at info level."""

    def __init__(self):
        self.total = 0
        self.after_warm_up: list[str] = []  # each kernel's name and specialization
        self._serving = False
        self._knobs = self._previous = None
        try:
            from triton import knobs
        except ImportError:  # a Triton without knobs: nothing is watched
            return
        self._knobs = knobs.runtime
        self._previous = self._knobs.jit_cache_hook
        self._knobs.jit_cache_hook = self._hook

    def _hook(self, *args, **kwargs):
        self.total += 1
        if self._serving and self._knobs is not None:
            what = _describe(kwargs)
            self.after_warm_up.append(what)
            logger.info("kernel compiled after warm-up (its first step waited for it): %s", what)
        return self._previous(*args, **kwargs) if self._previous is not None else None

    def serving(self) -> None:
        self._serving = True

    def close(self) -> None:
        """Put the previous hook back (when ours is still the installed one)."""
        if self._knobs is not None and self._knobs.jit_cache_hook == self._hook:
            self._knobs.jit_cache_hook = self._previous
        self._knobs = None


def _describe(hook_kwargs: dict) -> str:
    """A compile as the hook sees it: the kernel, its launch options, and the arguments Triton specialized
    (their indices and attributes: divisibility by 16, equality to 1) and held constant."""
    fn = getattr(hook_kwargs.get("fn"), "name", "?")
    c = hook_kwargs.get("compile") or {}
    options = {k: c.get(k) for k in ("num_warps", "num_stages")}
    configs = c.get("configs") or [None]
    constants = {k: v for k, v in (c.get("constants") or {}).items() if not callable(v)}
    return f"{fn} {options} specialized {configs[0]} constants {constants}"[:2000]


def eager_warm_up_plans(max_tokens: int, graph_tokens: int, page_size: int, num_slots: int,
                        context_length: int) -> list[tuple]:
    """The eager steps to run before serving, as (prefix_lens, run lengths) pairs: steps of about
    max_tokens (the scheduler's chunk) when it is above graph_tokens (the largest graphed extend step),
    else none. Between them they give the size arguments each of Triton's classes: 1, 3 and 16 rows, a
    token count that is a multiple of 16 and one that is not, from position 0 and from a cached prefix
    that ends inside a page; and one row at both ends of each power-of-two range of token counts in
    between. No row passes context_length."""
    if max_tokens <= graph_tokens or max_tokens < 2 * max(WARM_UP_ROWS):
        return []
    prefix = 2 * page_size + 3
    plans = []
    for rows in WARM_UP_ROWS:
        if rows > num_slots:
            continue
        for p in (0, prefix):
            room = rows * ((context_length - p) // 16 * 16)  # a multiple of 16 that every row can hold
            for total in (min(max_tokens, room), min(max_tokens, room) - 3):
                base = total // rows
                lens = [base] * (rows - 1) + [total - base * (rows - 1)]
                if base > 0 and p + lens[-1] <= context_length:
                    plans.append(([p] * rows, lens))
    # one row at each end of every power-of-two range of token counts above the graphs: a block size
    # taken as the next power of two of a multiple of the token count (the MoE sort's chunk) meets each value
    edge = max(1, next_power_of_2(graph_tokens + 1) // 2)
    while edge < min(max_tokens, context_length):
        plans += [([0], [n]) for n in sorted({edge + 1, 2 * edge}) if n < min(max_tokens, context_length)]
        edge *= 2
    return plans


def eager_decode_plans(page_size: int, context_length: int, num_slots: int) -> list[tuple]:
    """Eager decode steps (above the decode graphs' batch, or with graphs off), as (prefix_lens, run
    lengths) pairs: 1 and 3 rows over a context of one page and a long one, so the attention kernels
    meet both of their launch configs (one split of the context, several)."""
    contexts = sorted({min(page_size - 1, context_length - 1), max(1, min(4096, context_length - 1))})
    return [([c] * rows, [1] * rows) for rows in (1, 3) if rows <= num_slots for c in contexts]


@torch.inference_mode()
def warm_up_eager_steps(runner) -> int:
    """Run eager_warm_up_plans and eager_decode_plans on runner's live pools (slots, pages and snapshot
    rows taken and given back; the tokens are arbitrary), each extend row cut twice when snapshot rows
    are free. Every rank of a tensor-parallel group runs the same steps (the model's all-reduces pair
    up). Returns the steps run."""
    a, config = runner.allocator, runner.config
    plans = eager_warm_up_plans(runner._max_step_tokens(), runner._extend_graph_tokens(), a.page_size,
                                a.num_free_slots, runner.context_length)
    decode = eager_decode_plans(a.page_size, runner.context_length, a.num_free_slots)
    ran = 0
    steps = [(ForwardMode.EXTEND, p) for p in plans] + [(ForwardMode.DECODE, p) for p in decode]
    for mode, (prefix_lens, lens) in steps:
        if sum(a.pages_for(p + n) for p, n in zip(prefix_lens, lens)) > a.num_free_pages:
            continue
        slots = [a.alloc_slot() for _ in lens]
        cut_rows = []
        try:
            snapshots = []
            for slot, p, n in zip(slots, prefix_lens, lens):
                a.grow(slot, p + n)
                cuts = []
                for pos in sorted({p + n // 2, p + n - 1}):
                    index = a.alloc_snapshot() if pos > p and mode is ForwardMode.EXTEND else None
                    if index is not None:
                        cuts.append((pos, index))
                        cut_rows.append(index)
                snapshots.append(cuts)
            tokens = [[(7 * i + j) % config.vocab_size for j in range(n)] for i, n in enumerate(lens)]
            ends = [end - 1 for end in itertools.accumulate(lens)]
            plan = StepPlan(mode=mode, tokens=tokens, prefix_lens=prefix_lens, slots=slots,
                            snapshots=snapshots if any(snapshots) else None, logit_rows=ends)
            hidden = runner.eager_forward(plan)
            runner.model.compute_logits(hidden[runner.inputs.logit_rows(ends)])
            ran += 1
        finally:
            for index in cut_rows:
                a.free_snapshot(index)
            for slot in slots:
                a.free_slot(slot)
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    return ran


@torch.inference_mode()
def warm_up_sampler(runner) -> None:
    """Sample at the largest batch the memory profile allowed for, once with every filter, a seeded
    and a greedy row, once with temperature alone, once with top_p alone: the first sampled steps would
    otherwise compile the sampling kernels (the draw with and without top-k's ties, the top_p race and
    its search), load torch's (topk, RNG) and grow the caching allocator by the [rows, V] temporaries.
    The default generator is left as it was."""
    rows = min(runner.plan.max_running_requests, runner.args.max_running_requests or 256)
    knobs = [SamplingParams(temperature=0.7), SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05),
             SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=0)]
    reqs = [Req(rid=f"warm-up-{i}", prompt_ids=[0], params=knobs[i] if i < len(knobs) else knobs[0])
            for i in range(rows)]
    reqs[min(2, rows - 1)].generator = torch.Generator(device=runner.device).manual_seed(0)
    logits = torch.zeros(rows, runner.config.vocab_size, device=runner.device)  # flat: top_p past the candidates
    uniform = [[Req(rid=f"warm-up-{n}-{i}", prompt_ids=[0], params=knobs[n]) for i in range(rows)]
               for n in (0, 2)]  # temperature alone, top_p alone
    with torch.random.fork_rng(devices=[runner.device] if runner.device.type == "cuda" else []):
        for batch in (reqs, *uniform):
            Sampler()(logits, batch, runner.config.eos_token_ids)
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
