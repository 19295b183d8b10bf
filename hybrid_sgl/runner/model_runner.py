"""ModelRunner: owns the model, the pools and the allocator; runs one scheduled batch per call.

run(mode, items) builds a ForwardBatch, runs the model, computes logits only for the rows
that need them (sampling rows and requested prompt-logprob rows), samples, and returns one
ItemResult per item. It never changes request state: the scheduler applies the results.

Under tensor parallelism this runner is rank 0's: every forward goes through `forward_step`, which
first hands the step (a StepMessage) to `broadcast`, so the other ranks run the same forward on
their shards (runner/tp_step.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.constrained.bitmask import MaskBuffer
from hybrid_sgl.distributed import SINGLE, TPGroup, building_with
from hybrid_sgl.distributed.sharding import local_config
from hybrid_sgl.layers.backends import resolve_backend
from hybrid_sgl.layers.quantization import fp8_config
from hybrid_sgl.memory.allocator import Allocator
from hybrid_sgl.memory.kv_pool import KVPool
from hybrid_sgl.memory.memory_plan import MemoryPlan, StateShapes, available_ram_bytes, plan_memory
from hybrid_sgl.memory.state_pool import StatePool
from hybrid_sgl.models.base import Backends
from hybrid_sgl.models.loader import build_model
from hybrid_sgl.runner.cuda_graph import DecodeGraphs
from hybrid_sgl.runner.forward_batch import ForwardBatch, ForwardMode
from hybrid_sgl.runner.sampler import Sampler, ids_logprobs, logprobs_of
from hybrid_sgl.runner.tp_step import step_message
from hybrid_sgl.sampling_params import SamplingParams
from hybrid_sgl.scheduler.request import Req
from hybrid_sgl.server_args import ServerArgs

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class BatchItem:
    req: Req
    start: int  # first position computed in this step
    end: int  # one past the last
    sample: bool  # sample the next token from the last row
    snapshots: list[tuple[int, int]] = field(default_factory=list)  # (position in (start, end), snapshot index)


@dataclass
class ItemResult:
    next_token: int | None = None
    token_logprob: float | None = None
    top_logprobs: list = field(default_factory=list)
    # prompt positions whose logprob was computed this step: (position, logprob, top pairs)
    input_logprobs: list[tuple[int, float, list]] = field(default_factory=list)
    # token_ids_logprob: (logprob, id) of each chosen id, at the sampled position and at those prompt positions
    token_ids_logprobs: list[tuple[float, int]] | None = None
    input_token_ids_logprobs: list[list[tuple[float, int]]] = field(default_factory=list)


@dataclass
class PendingDecode:
    """A decode step launched on the device whose sampled tokens the host has not read yet.
    While `logits` is set the step is launched but not sampled yet (ModelRunner.sample_pending)."""

    items: list[BatchItem]
    next_ids: torch.Tensor | None  # [B] int64 on the device
    host_ids: torch.Tensor | None  # [B] int64, pinned on CUDA; filled by an async copy
    done: torch.cuda.Event | None
    deferred: list[Req] = field(default_factory=list)  # finished earlier; their slots free after this step
    logits: torch.Tensor | None = None  # [B, V] until sampled

    def results(self) -> list[ItemResult]:
        """Waits for the step; one ItemResult (next token only) per item."""
        if self.done is not None:
            self.done.synchronize()
        return [ItemResult(next_token=t) for t in self.host_ids.tolist()]


class ModelRunner:
    def __init__(self, args: ServerArgs, config: ModelConfig, tp: TPGroup = SINGLE, broadcast=None,
                 pool_classes: tuple[type, type] = (StatePool, KVPool)):
        """tp: this process's tensor-parallel group; broadcast(StepMessage): sends each step to the other
        ranks (rank 0 only); pool_classes: the (state, KV) pool classes (rank 0 records its copies)."""
        self.args = args
        self.config = config
        self.tp, self.broadcast, self.pool_classes = tp, broadcast, pool_classes
        self.local_config = local_config(config, tp.size)  # this rank's heads: what its pools hold
        self.device = torch.device(args.device)
        self.dtype = self._resolve_dtype(args.dtype, config)
        self.context_length = args.context_length or config.context_length
        if self.context_length > config.context_length:
            raise ValueError(f"context_length={self.context_length} exceeds the model's "
                             f"max_position_embeddings={config.context_length}")
        backends = self._resolve_backends(args, config)
        if args.random_seed is not None:
            torch.manual_seed(args.random_seed)
        with building_with(tp):
            self.model = build_model(config, backends, dtype=self.dtype, device=self.device,
                                     max_positions=self.context_length, load_format=args.load_format,
                                     model_path=args.model_path, seed=args.random_seed,
                                     quantization=fp8_config(config.quantization_config, args.quantization,
                                                              args.enable_fp8_experts))
        self.state_shapes = self._state_shapes()
        self.plan = self._plan_memory()
        if tp.size > 1:
            p = self.plan
            tp.check_same("the memory plan (slots, pages, snapshots, context length)",
                          (p.max_running_requests, p.num_pages, p.num_snapshots, p.context_length))
        self.context_length = self.plan.context_length  # one request alone always fits
        self.state_pool, self.kv_pool, self.allocator = self._make_pools(self.plan)
        self.graphs = self._capture_decode_graphs(backends)
        rows, pinned = self.plan.max_running_requests, self.device.type == "cuda"
        self._host_ids = [torch.empty(rows, dtype=torch.int64, pin_memory=pinned) for _ in range(2)]
        self._host_turn = 0
        self._masks: MaskBuffer | None = None  # token bitmasks of constrained requests, made on first use
        self.sampler = Sampler()
        if self.device.type == "cuda" and tp.rank == 0:  # rank 0 samples for every rank
            self._warm_up_sampler()
        for line in self.model.dispatch_plan():
            logger.info(line)
        logger.info(self.plan.describe())

    # ---- setup -----------------------------------------------------------------------------------
    def _resolve_backends(self, args: ServerArgs, config: ModelConfig) -> Backends:
        """Only the bundles the layer plan uses (an unused backend need not exist here)."""
        mixers = {m for m, _ in config.layer_plan}
        device = self.device.type

        def need(kind: str, requested: str, used: bool):
            return resolve_backend(kind, requested, device) if used else None

        return Backends(
            attention=need("attention", args.attention_backend, bool(config.kv_layers)),
            linear_attention=need("linear_attention", args.linear_attn_backend, "linear_attention" in mixers),
            ssm=need("ssm", args.linear_attn_backend, bool(mixers & {"mamba2", "mamba", "attention_mamba2"})),
            moe=need("moe", args.moe_runner_backend, any(f == "moe" for _, f in config.layer_plan)),
        )

    @staticmethod
    def _resolve_dtype(name: str, config: ModelConfig) -> torch.dtype:
        if name == "auto":
            return DTYPES.get(config.dtype, torch.bfloat16) if torch.cuda.is_available() else torch.float32
        return DTYPES[name]

    def _state_shapes(self) -> StateShapes | None:
        shapes = self.local_config.recurrent_state_shapes()
        if shapes is None:
            return None
        conv_shape, ssm_shape = shapes
        return StateShapes(num_layers=len(self.config.state_layers), conv_shape=conv_shape, conv_dtype=self.dtype,
                           ssm_shape=ssm_shape, ssm_dtype=DTYPES[self.args.mamba_ssm_dtype])

    def _budget_bytes(self) -> int:
        frac = self.args.mem_fraction_static
        if self.device.type == "cuda":
            peak = self._profile_step_bytes()
            free, total = torch.cuda.mem_get_info(self.device)
            logger.info("profiled warm-up step: %.2f GiB of activations", peak / 2**30)
            budget = int(free - total * (1 - frac) - peak)
        else:
            budget = int(available_ram_bytes() * frac)
        return budget if self.tp.size == 1 else self.tp.min_int(budget)  # every rank plans the same pools

    @torch.inference_mode()
    def _profile_step_bytes(self) -> int:
        """Peak transient memory of the largest step: a prefill chunk at chunked_prefill_size, run on
        throw-away pools of one slot, plus logits for a full decode batch."""
        tokens = self.args.chunked_prefill_size if self.args.chunked_prefill_size > 0 else self.context_length
        tokens = min(tokens, self.context_length)
        plan = MemoryPlan(budget_bytes=0, state_bytes_per_request=0, kv_bytes_per_token=0, max_running_requests=1,
                          page_size=self.args.page_size, num_pages=-(-tokens // self.args.page_size),
                          context_length=tokens)
        state_pool, kv_pool, allocator = self._make_pools(plan, context_length=tokens)
        slot = allocator.alloc_slot()
        allocator.grow(slot, tokens)
        ids = torch.randint(0, self.config.vocab_size, (tokens,)).tolist()
        fb = ForwardBatch.build(mode=ForwardMode.EXTEND, token_runs=[ids], prefix_lens=[0], slots=[slot],
                                page_table=allocator.page_table, page_size=plan.page_size, kv_pool=kv_pool,
                                state_pool=state_pool, device=self.device)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        hidden = self.model(fb)
        rows = min(tokens, self.args.max_running_requests or 256)
        self.model.compute_logits(hidden[-rows:]).softmax(-1)
        peak = torch.cuda.max_memory_allocated(self.device) - base
        del fb, hidden, state_pool, kv_pool, allocator
        torch.cuda.empty_cache()
        return peak

    def _plan_memory(self) -> MemoryPlan:
        return plan_memory(config=self.local_config, state=self.state_shapes, kv_dtype=self.dtype,
                           budget_bytes=self._budget_bytes(), on_gpu=self.device.type == "cuda",
                           page_size=self.args.page_size, context_length=self.context_length,
                           max_running_requests=self.args.max_running_requests,
                           max_total_tokens=self.args.max_total_tokens,
                           prefix_cache=not self.args.disable_radix_cache,
                           mamba_full_memory_ratio=self.args.mamba_full_memory_ratio,
                           max_mamba_cache_size=self.args.max_mamba_cache_size)

    def _make_pools(self, plan: MemoryPlan, context_length: int | None = None):
        s, attn = self.state_shapes, self.local_config.attention
        state_cls, kv_cls = self.pool_classes if context_length is None else (StatePool, KVPool)
        state_pool = None
        if s is not None:
            state_pool = state_cls(num_layers=s.num_layers, num_slots=plan.max_running_requests,
                                   conv_shape=s.conv_shape, conv_dtype=s.conv_dtype, ssm_shape=s.ssm_shape,
                                   ssm_dtype=s.ssm_dtype, device=self.device, num_snapshots=plan.num_snapshots)
        n_attn = len(self.config.kv_layers)
        kv_pool = None
        if n_attn:
            kv_pool = kv_cls(num_layers=n_attn, num_pages=plan.num_pages, page_size=plan.page_size,
                             num_kv_heads=attn.num_kv_heads, head_dim=attn.head_dim, dtype=self.dtype,
                             device=self.device)
        allocator = Allocator(num_slots=plan.max_running_requests, num_pages=plan.num_pages,
                              page_size=plan.page_size,
                              max_pages_per_request=-(-(context_length or self.context_length) // plan.page_size),
                              device=self.device, num_snapshots=plan.num_snapshots)
        return state_pool, kv_pool, allocator

    def _capture_decode_graphs(self, backends: Backends) -> DecodeGraphs | None:
        """Decode graphs on CUDA when every kernel on the decode path can be captured (no host syncs:
        the Triton / vLLM kernels; the torch references sync)."""
        capturable = all(ops is None or ops.name != "torch" for ops in
                         (backends.attention, backends.linear_attention, backends.ssm, backends.moe))
        if self.device.type != "cuda" or self.args.disable_cuda_graph or not capturable or self.tp.size > 1:
            return None
        max_bs = min(self.args.cuda_graph_max_bs or 256, self.plan.max_running_requests)
        graphs = DecodeGraphs(model=self.model, allocator=self.allocator, kv_pool=self.kv_pool,
                              state_pool=self.state_pool, max_bs=max_bs, device=self.device,
                              take_prev_ids=not self.args.disable_overlap_schedule)
        graphs.capture()
        return graphs

    @torch.inference_mode()
    def _warm_up_sampler(self) -> None:
        """Sample at the largest batch the memory profile allowed for, once with every filter, a seeded
        and a greedy row, once with temperature alone, once with top_p alone: the first sampled steps would
        otherwise compile the sampling kernels (the draw with and without top-k's ties, the top_p race and
        its search), load torch's (topk, RNG) and grow the caching allocator by the [rows, V] temporaries.
        The default generator is left as it was."""
        rows = min(self.plan.max_running_requests, self.args.max_running_requests or 256)
        knobs = [SamplingParams(temperature=0.7), SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.05),
                 SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=0)]
        reqs = [Req(rid=f"warm-up-{i}", prompt_ids=[0], params=knobs[i] if i < len(knobs) else knobs[0])
                for i in range(rows)]
        reqs[min(2, rows - 1)].generator = torch.Generator(device=self.device).manual_seed(0)
        logits = torch.zeros(rows, self.config.vocab_size, device=self.device)  # flat: top_p past the candidates
        uniform = [[Req(rid=f"warm-up-{n}-{i}", prompt_ids=[0], params=knobs[n]) for i in range(rows)]
                   for n in (0, 2)]  # temperature alone, top_p alone
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            for batch in (reqs, *uniform):
                Sampler()(logits, batch, self.config.eos_token_ids)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ---- one step --------------------------------------------------------------------------------
    @staticmethod
    def can_overlap(items: list[BatchItem]) -> bool:
        """Whether a decode batch may run without the host waiting for its tokens: every row samples,
        and nothing in sampling reads the request's outputs so far (penalties, min_new_tokens) or
        returns logprobs."""
        return all(it.sample and not it.req.return_logprob and not it.req.params.uses_penalties
                   and it.req.params.min_new_tokens == 0 for it in items)

    @torch.inference_mode()
    def launch_decode(self, items: list[BatchItem], prev: PendingDecode | None = None,
                      prev_rows: list[int] | None = None) -> PendingDecode:
        """Launch a decode step and its sampling without waiting for them. prev_rows[i] >= 0: item i's
        input token is the one `prev` sampled in that row (still on the device).

        Constrained requests: a grammar's mask for this step needs the token `prev` sampled, which
        the host has not read yet. So a batch with a grammar launched behind `prev` runs its forward
        only; the scheduler reads `prev`, advances the matchers, then calls sample_pending. The
        device computes this step's forward while the host reads `prev` and fills the masks; only
        the sampling waits for them. (Decode graphs end at the logits, so masking stays outside.)"""
        prev_rows = prev_rows or [-1] * len(items)
        tokens = [-(j + 1) if j >= 0 else it.req.token_slice(it.start, it.end)[0] for it, j in zip(items, prev_rows)]
        prev_ids = prev.next_ids if prev is not None else None
        positions, slots = [it.start for it in items], [it.req.slot for it in items]
        prev_fits = prev is None or self.graphs is None or self.graphs.fits(len(prev.items))
        if self.graphs is not None and self.graphs.fits(len(items)) and prev_fits:
            logits = self.graphs.run(tokens, positions, slots, prev_ids=prev_ids)
        else:
            logits = self.forward_step(ForwardMode.DECODE, [[t] for t in tokens], positions, slots, prev_ids=prev_ids)
        pending = PendingDecode(items=items, next_ids=None, host_ids=None, done=None, logits=logits)
        if prev is None or all(it.req.grammar is None for it in items):
            self.sample_pending(pending)
        return pending

    @torch.inference_mode()
    def sample_pending(self, pending: PendingDecode) -> None:
        """Sample a launched step (masks from the matchers as they are now) and start copying its tokens."""
        reqs = [it.req for it in pending.items]
        logits, pending.logits = pending.logits, None
        next_ids = self.sampler(logits, reqs, self.config.eos_token_ids, self._grammar_mask(reqs, logits.shape[-1]))
        on_gpu = self.device.type == "cuda"
        # two host buffers in turn: at most two steps are alive (one launched, one being read)
        self._host_turn ^= 1
        host_ids = self._host_ids[self._host_turn][:len(reqs)]
        host_ids.copy_(next_ids, non_blocking=on_gpu)
        if on_gpu:
            pending.done = torch.cuda.Event()
            pending.done.record()
        pending.next_ids, pending.host_ids = next_ids, host_ids

    def _grammar_mask(self, reqs: list[Req], vocab: int) -> torch.Tensor | None:
        """[len(reqs), ceil(vocab / 32)] token bitmask on the device, or None when no row is constrained.
        A finished request's row (discarded in an overlapped step) allows every token."""
        matchers = [r.grammar if r.grammar is not None and not r.finished else None for r in reqs]
        if all(m is None for m in matchers):
            return None
        if self._masks is None:
            self._masks = MaskBuffer(self.plan.max_running_requests, vocab, self.device)
        return self._masks.fill(matchers)

    @torch.inference_mode()
    def run(self, mode: ForwardMode, items: list[BatchItem]) -> list[ItemResult]:
        rows, sample_rows, lp_rows = self._logit_rows(items)
        results = [ItemResult() for _ in items]
        if mode is ForwardMode.DECODE and self.graphs is not None and self.graphs.fits(len(items)):
            logits = self.graphs.run([it.req.token_slice(it.start, it.end)[0] for it in items],
                                     [it.start for it in items], [it.req.slot for it in items])
            if rows != list(range(len(items))):  # every row; decode samples (almost) all of them
                logits = logits[torch.tensor(rows, device=self.device, dtype=torch.long)]
        else:
            logits = self.forward_step(mode, [it.req.token_slice(it.start, it.end) for it in items],
                                   [it.start for it in items], [it.req.slot for it in items],
                                   snapshots=[it.snapshots for it in items], rows=rows)
        if not rows:
            return results
        if sample_rows:
            self._sample(logits, items, results, sample_rows)
        if lp_rows:
            self._input_logprobs(logits, items, results, lp_rows)
        return results

    def forward_step(self, mode: ForwardMode, token_runs: list[list[int]], prefix_lens: list[int], slots: list[int], *,
                 prev_ids: torch.Tensor | None = None, snapshots: list | None = None,
                 rows: list[int] | None = None) -> torch.Tensor | None:
        """One eager forward: logits [len(rows), V] of the packed rows `rows` (None: every row; none
        are computed when rows is empty). The other tensor-parallel ranks run it too (see tp.py)."""
        if self.broadcast is not None:
            self.broadcast(step_message(self, mode, token_runs, prefix_lens, slots, prev_ids, snapshots, rows))
        fb = ForwardBatch.build(mode=mode, token_runs=token_runs, prefix_lens=prefix_lens, slots=slots,
                                page_table=self.allocator.page_table, page_size=self.allocator.page_size,
                                kv_pool=self.kv_pool, state_pool=self.state_pool, device=self.device,
                                prev_ids=prev_ids, snapshots=snapshots)
        hidden = self.model(fb)
        if rows is None:
            return self.model.compute_logits(hidden)
        if not rows:
            return None
        return self.model.compute_logits(hidden[torch.tensor(rows, device=self.device, dtype=torch.long)])

    def _logit_rows(self, items: list[BatchItem]):
        """Rows of the packed batch that need logits. sample_rows: (item, logits row);
        lp_rows: (item, logits row, prompt position p whose logits score token p + 1)."""
        rows, sample_rows, lp_rows, offset = [], [], [], 0
        for i, it in enumerate(items):
            req = it.req
            if req.wants_input_logprobs():
                lo = req.input_logprob_pos - 1
                for p in range(max(it.start, lo), min(it.end, len(req.prompt_ids) - 1)):
                    lp_rows.append((i, len(rows), p))
                    rows.append(offset + p - it.start)
            if it.sample:
                last = offset + it.end - it.start - 1
                if rows and rows[-1] == last:
                    sample_rows.append((i, len(rows) - 1))
                else:
                    sample_rows.append((i, len(rows)))
                    rows.append(last)
            offset += it.end - it.start
        return rows, sample_rows, lp_rows

    def _sample(self, logits, items, results, sample_rows) -> None:
        idx = torch.tensor([r for _, r in sample_rows], device=self.device)
        reqs = [items[i].req for i, _ in sample_rows]
        chosen = logits[idx]
        next_ids = self.sampler(chosen, reqs, self.config.eos_token_ids, self._grammar_mask(reqs, chosen.shape[-1]))
        want = [r.return_logprob for r in reqs]
        top_k = max([r.top_logprobs_num for r in reqs if r.return_logprob], default=0)
        lps, tops = logprobs_of(chosen, next_ids, top_k) if any(want) else (None, None)
        for j, ((i, _), token) in enumerate(zip(sample_rows, next_ids.tolist())):
            results[i].next_token = token
            if want[j]:
                results[i].token_logprob = lps[j]
                results[i].top_logprobs = tops[j][: reqs[j].top_logprobs_num]
        if any(r.return_logprob and r.token_ids_logprob for r in reqs):
            chosen_lps = ids_logprobs(chosen, [r.token_ids_logprob if r.return_logprob else None for r in reqs])
            for j, (i, _) in enumerate(sample_rows):
                if want[j] and reqs[j].token_ids_logprob:
                    results[i].token_ids_logprobs = chosen_lps[j]

    def _input_logprobs(self, logits, items, results, lp_rows) -> None:
        idx = torch.tensor([r for _, r, _ in lp_rows], device=self.device)
        targets = torch.tensor([items[i].req.prompt_ids[p + 1] for i, _, p in lp_rows], device=self.device)
        top_k = max(items[i].req.top_logprobs_num for i, _, _ in lp_rows)
        lps, tops = logprobs_of(logits[idx], targets, top_k)
        for (i, _, p), lp, top in zip(lp_rows, lps, tops):
            results[i].input_logprobs.append((p + 1, lp, top[: items[i].req.top_logprobs_num]))
        ids = [items[i].req.token_ids_logprob for i, _, _ in lp_rows]
        if any(ids):
            for (i, _, _), chosen_lps in zip(lp_rows, ids_logprobs(logits[idx], ids)):
                results[i].input_token_ids_logprobs.append(chosen_lps)
