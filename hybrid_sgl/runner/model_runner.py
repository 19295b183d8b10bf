"""ModelRunner: owns the model and runs one scheduled batch per call on the pools that memory/
builds from the memory plan it profiles (memory/pools.py).

run(mode, items) turns the batch into a StepPlan, runs it (replaying a CUDA graph of its shape
when one is captured, else eagerly through the same step-input builder), computes logits only for the rows
that need them (sampling rows and requested prompt-logprob rows), samples, and returns one
ItemResult per item. It never changes request state: the scheduler applies the results.

Under tensor parallelism this runner is rank 0's: every forward goes through `forward_step`, which
first hands the step (a StepMessage) to `broadcast`, so the other ranks run the same forward on
their shards (runner/tp_step.py). Their CUDA graphs (HYBRID_SGL_TP_CUDA_GRAPH=1, not yet run on GPUs)
are captured in the same order on every rank, the all-reduces inside them, and each rank replays the
shape rank 0 replays.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass, field

import torch

from hybrid_sgl.batch import ForwardMode, StepPlan
from hybrid_sgl.config import ModelConfig
from hybrid_sgl.constrained.bitmask import MaskBuffer
from hybrid_sgl.distributed import SINGLE, TPGroup, building_with
from hybrid_sgl.distributed.sharding import local_config
from hybrid_sgl.layers.backends import resolve_backends
from hybrid_sgl.layers.quantization import fp8_config
from hybrid_sgl.memory.allocator import Allocator
from hybrid_sgl.memory.kv_pool import KVPool
from hybrid_sgl.memory.memory_plan import MemoryPlan, StateShapes, plan_memory, pool_budget_bytes
from hybrid_sgl.memory.pools import KVShapes, build_pools
from hybrid_sgl.memory.state_pool import StatePool
from hybrid_sgl.models.base import Backends
from hybrid_sgl.models.loader import build_model
from hybrid_sgl.runner.cuda_graph import StepGraphs, decode_sizes, extend_shapes, short_row_shapes
from hybrid_sgl.runner.draft_vocab import DraftVocab, load_token_map
from hybrid_sgl.runner.sampler import Sampler
from hybrid_sgl.runner.speculative import SpecDecoder
from hybrid_sgl.runner.step_inputs import StepInputs
from hybrid_sgl.runner.step_results import ItemResult, input_logprobs_into, logit_rows, sampled_into
from hybrid_sgl.runner.tp_step import step_message
from hybrid_sgl.runner.warm_up import CompileWatch, warm_up_eager_steps, warm_up_sampler
from hybrid_sgl.scheduler.request import Req
from hybrid_sgl.server_args import ServerArgs
from triton_kernels.dense_linear import eager_step

logger = logging.getLogger(__name__)

# CUDA graphs under tensor parallelism (all-reduces captured): opt-in until they have run on several GPUs
TP_CUDA_GRAPHS = os.environ.get("HYBRID_SGL_TP_CUDA_GRAPH", "0") == "1"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class BatchItem:
    req: Req
    start: int  # first position computed in this step
    end: int  # one past the last
    sample: bool  # sample the next token from the last row
    snapshots: list[tuple[int, int]] = field(default_factory=list)  # (position in (start, end), snapshot index)


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
        self.spec_steps = args.speculative_num_steps if args.speculative_algorithm else 0
        if self.spec_steps and not config.mtp_layers:
            raise ValueError(f"--speculative-algorithm {args.speculative_algorithm} drafts with the checkpoint's MTP "
                             f"layer, and {config.architecture} at {args.model_path} has none (no mtp.* tensors, no "
                             "mtp_num_hidden_layers in config.json): serve it without --speculative-algorithm")
        if not self.spec_steps and config.mtp_layers:
            config = dataclasses.replace(config, mtp_layers=0)  # its mtp.* tensors are skipped
        token_map = (load_token_map(args.speculative_token_map, config.vocab_size)
                     if self.spec_steps and args.speculative_token_map else None)
        self.config = config
        self.tp, self.broadcast = tp, broadcast
        self.local_config = local_config(config, tp.size)  # this rank's heads: what its pools hold
        self.device = torch.device(args.device)
        self.dtype = self._resolve_dtype(args.dtype, config)
        self.context_length = args.context_length or config.context_length
        if self.context_length > config.context_length:
            raise ValueError(f"context_length={self.context_length} exceeds the model's "
                             f"max_position_embeddings={config.context_length}")
        backends = self._backends = self._resolve_backends(args, config)
        if args.random_seed is not None:
            torch.manual_seed(args.random_seed)
        with building_with(tp):
            self.model = build_model(config, backends, dtype=self.dtype, device=self.device,
                                     max_positions=self.context_length, load_format=args.load_format,
                                     model_path=args.model_path, seed=args.random_seed,
                                     quantization=fp8_config(config.quantization_config, args.quantization,
                                                              args.enable_fp8_experts))
        # the drafts' lm_head rows, made before the memory plan measures what is left
        self.draft_vocab = DraftVocab(token_map, self.model.lm_head.weight) if token_map is not None else None
        if self.draft_vocab is not None:
            logger.info("drafts choose among %d of %d token ids (--speculative-token-map): %.1f MiB of lm_head rows",
                        len(token_map), config.vocab_size, self.draft_vocab.nbytes / 2**20)
        self.state_shapes, self.kv_shapes = self._state_shapes(), self._kv_shapes()
        self.compile_watch = CompileWatch() if self.device.type == "cuda" else None
        warm_up_start = time.perf_counter()
        self.plan = self._plan_memory()  # runs the largest prefill step once (compiles and tunes its kernels)
        if tp.size > 1:
            p = self.plan
            tp.check_same("the memory plan (slots, pages, snapshots, context length)",
                          (p.max_running_requests, p.num_pages, p.num_snapshots, p.context_length))
        self.context_length = self.plan.context_length  # one request alone always fits
        self.pools = build_pools(self.plan, state=self.state_shapes, kv=self.kv_shapes, device=self.device,
                                 classes=pool_classes)
        self.state_pool, self.kv_pool, self.allocator = self.pools
        self.inputs = self._step_inputs(self.allocator, self.kv_pool, self.state_pool, self._max_step_tokens(),
                                        self.plan.max_running_requests + 1)
        self.last_hidden: torch.Tensor | None = None
        self.speculative = (SpecDecoder(self, self.spec_steps, args.speculative_disable_by_batch_size,
                                        replay=args.speculative_rollback == "replay",
                                        chain=args.chains_verify_steps) if self.spec_steps else None)
        self.graphs, self.extend_graphs, self.verify_graphs = self._capture_graphs(backends)
        rows, pinned = self.plan.max_running_requests, self.device.type == "cuda"
        self._host_ids = [torch.empty(rows, dtype=torch.int64, pin_memory=pinned) for _ in range(2)]
        self._host_turn = 0
        self._masks: MaskBuffer | None = None  # token bitmasks of constrained requests, made on first use
        self.sampler = Sampler()
        if self.device.type == "cuda":
            eager_steps = warm_up_eager_steps(self)  # every rank: the steps' all-reduces pair up
            if self.speculative is not None:
                self.speculative.warm_up()
            if tp.rank == 0:  # rank 0 samples for every rank
                warm_up_sampler(self)
            self.compile_watch.serving()
            logger.info("warm-up before serving (the largest prefill step, CUDA graphs, %d eager steps, the "
                        "sampler): %.1f s, %d kernels compiled", eager_steps, time.perf_counter() - warm_up_start,
                        self.compile_watch.total)
        for line in self.model.dispatch_plan():
            logger.info(line)
        logger.info(self.plan.describe())

    # ---- setup -----------------------------------------------------------------------------------
    def _resolve_backends(self, args: ServerArgs, config: ModelConfig) -> Backends:
        """Only the bundles the layer plan uses (an unused backend need not exist here)."""
        return resolve_backends(config, self.device.type, attention=args.attention_backend,
                                linear_attention=args.linear_attn_backend, moe=args.moe_runner_backend)

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

    def _kv_shapes(self) -> KVShapes | None:
        if not self.config.kv_layers:
            return None
        attn = self.local_config.attention
        return KVShapes(num_layers=len(self.config.kv_layers) + self.config.mtp_layers, num_kv_heads=attn.num_kv_heads,
                        head_dim=attn.head_dim, dtype=self.dtype)

    def _budget_bytes(self) -> int:
        activations = self._activation_bytes() if self.device.type == "cuda" else 0
        budget = pool_budget_bytes(device=self.device, mem_fraction_static=self.args.mem_fraction_static,
                                   activation_bytes=activations)
        return budget if self.tp.size == 1 else self.tp.min_int(budget)  # every rank plans the same pools

    def _activation_bytes(self) -> int:
        """What the pools must leave free on CUDA: the largest extend step's activations, plus the memory
        the extend graphs keep."""
        peak = self._profile_step_bytes(self._max_step_tokens())
        graph_tokens = self._extend_graph_tokens()
        graph_pool = self._profile_step_bytes(graph_tokens) if graph_tokens else 0
        logger.info("profiled warm-up step: %.2f GiB of activations (+ %.2f GiB for the extend graphs)",
                    peak / 2**30, graph_pool / 2**30)
        return peak + graph_pool

    def _max_step_tokens(self) -> int:
        """Most tokens one extend step computes (the scheduler's chunk)."""
        chunk = self.args.chunked_prefill_size
        return min(chunk, self.context_length) if chunk > 0 else self.context_length

    def _extend_graph_tokens(self) -> int:
        """Largest extend step replayed from a CUDA graph (0: none)."""
        if not self._graphs_possible():
            return 0
        return min(self.args.cuda_graph_max_tokens, self._max_step_tokens())

    @staticmethod
    def _step_inputs(allocator: Allocator, kv_pool, state_pool, max_tokens: int, max_rows: int) -> StepInputs:
        return StepInputs(max_tokens=max_tokens, max_rows=max_rows, page_table=allocator.page_table,
                          page_size=allocator.page_size, pad_slot=allocator.pad_slot, kv_pool=kv_pool,
                          state_pool=state_pool, device=allocator.page_table.device)

    @torch.inference_mode()
    def _profile_step_bytes(self, tokens: int) -> int:
        """Peak transient memory of an extend step of `tokens` tokens, run on throw-away pools of one
        slot, plus logits for a full decode batch."""
        plan = MemoryPlan(budget_bytes=0, state_bytes_per_request=0, kv_bytes_per_token=0, max_running_requests=1,
                          page_size=self.args.page_size, num_pages=-(-tokens // self.args.page_size),
                          context_length=tokens)
        state_pool, kv_pool, allocator = build_pools(plan, state=self.state_shapes, kv=self.kv_shapes,
                                                     device=self.device)
        slot = allocator.alloc_slot()
        allocator.grow(slot, tokens)
        ids = torch.randint(0, self.config.vocab_size, (tokens,)).tolist()
        inputs = self._step_inputs(allocator, kv_pool, state_pool, tokens, 1)
        fb = inputs.eager_batch(StepPlan(mode=ForwardMode.EXTEND, tokens=[ids], prefix_lens=[0], slots=[slot]))
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        hidden = self.model(fb)
        rows = min(tokens, self.args.max_running_requests or 256)
        self.model.compute_logits(hidden[-rows:]).softmax(-1)
        peak = torch.cuda.max_memory_allocated(self.device) - base
        del fb, hidden, inputs, state_pool, kv_pool, allocator
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
                           max_mamba_cache_size=self.args.max_mamba_cache_size,
                           extra_kv_layers=self.config.mtp_layers, draft_rows_per_request=self.spec_steps)

    def _graphs_possible(self) -> bool:
        """CUDA graphs need CUDA, a kernel on every path that can be captured (no host syncs: the Triton /
        vLLM kernels; the torch references sync) and one rank unless TP_CUDA_GRAPHS (NCCL's all-reduce is
        captured like a kernel; every rank captures the same shapes in the same order)."""
        b = self._backends
        capturable = all(ops is None or ops.name != "torch" for ops in (b.attention, b.linear_attention, b.ssm, b.moe))
        ranks_ok = self.tp.size == 1 or TP_CUDA_GRAPHS
        return self.device.type == "cuda" and not self.args.disable_cuda_graph and capturable and ranks_ok

    def _capture_graphs(self, backends: Backends) -> tuple[StepGraphs | None, StepGraphs | None, StepGraphs | None]:
        """(decode graphs, extend graphs, verify graphs), each None when not captured. Verify graphs (with
        speculative decoding) are extend graphs of short rows, k + 1 tokens a request; the MTP passes'
        graphs are captured at their shapes too (SpecDecoder.capture_graphs)."""
        if not self._graphs_possible():
            return None, None, None
        max_bs = min(self.args.cuda_graph_max_bs or 256, self.plan.max_running_requests)
        decode = StepGraphs(model=self.model, inputs=self.inputs, mode=ForwardMode.DECODE,
                            shapes=[(bs, bs) for bs in decode_sizes(max_bs)],
                            with_prev=not self.args.disable_overlap_schedule)
        decode.capture()
        extend = verify = None
        if self._extend_graph_tokens():
            extend = StepGraphs(model=self.model, inputs=self.inputs, mode=ForwardMode.EXTEND,
                                shapes=extend_shapes(self._extend_graph_tokens(), self.plan.max_running_requests + 1))
            extend.capture()
        if self.speculative is not None:  # verify steps and drafts run below the speculation's batch limit only
            spec_bs = min(max_bs, self.speculative.max_verify_rows)
            if spec_bs < 1:
                return decode, extend, None
            shapes = [s for s in short_row_shapes(spec_bs, self.spec_steps + 1) if self.inputs.fits(*s)]
            verify = StepGraphs(model=self.model, inputs=self.inputs, mode=ForwardMode.EXTEND, shapes=shapes,
                                short_rows=True, replay_recurrent=self.speculative.replay)
            verify.capture()
            self.speculative.capture_graphs(shapes, decode_sizes(spec_bs))
        return decode, extend, verify

    def release(self) -> None:
        """Drop the weights, graphs, pools and step buffers once no step will run again (Engine.shutdown),
        so that whatever still holds the runner, its pools or the engine holds no device memory by them."""
        self.graphs = self.extend_graphs = self.verify_graphs = None
        if self.compile_watch is not None:
            self.compile_watch.close()
        if self.speculative is not None:
            self.speculative.release()
        self.model = self.inputs = self.last_hidden = self._masks = self.draft_vocab = None
        for pool in (self.state_pool, self.kv_pool):
            if pool is not None:
                pool.release()

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
                      prev_rows: list[int] | None = None, sample: bool = True) -> PendingDecode:
        """Launch a decode step without waiting for it. prev_rows[i] >= 0: item i's input token is the
        one `prev` sampled in that row (still on the device). sample: also launch its sampling; else
        the caller samples it later with sample_pending (when it decides so: scheduler/overlap.py).
        Decode graphs end at the logits, so sampling and its masks stay outside them."""
        prev_rows = prev_rows or [-1] * len(items)
        tokens = [[0] if j >= 0 else it.req.token_slice(it.start, it.end) for it, j in zip(items, prev_rows)]
        plan = StepPlan(mode=ForwardMode.DECODE, tokens=tokens,
                        prefix_lens=[it.start for it in items], slots=[it.req.slot for it in items],
                        prev_rows=prev_rows if any(j >= 0 for j in prev_rows) else None)
        logits = self.forward_step(plan, prev_ids=prev.next_ids if prev is not None else None)
        pending = PendingDecode(items=items, next_ids=None, host_ids=None, done=None, logits=logits)
        if sample:
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
    def run(self, mode: ForwardMode, items: list[BatchItem], while_running=None) -> list[ItemResult]:
        """Run a step and read its results. while_running(): host work that needs the step launched but
        not its results, called while the device computes it (before sampling waits for it)."""
        rows, sample_rows, lp_rows = logit_rows(items)
        results = [ItemResult() for _ in items]
        snapshots = [it.snapshots for it in items]
        plan = StepPlan(mode=mode, tokens=[it.req.token_slice(it.start, it.end) for it in items],
                        prefix_lens=[it.start for it in items], slots=[it.req.slot for it in items],
                        snapshots=snapshots if any(snapshots) else None, logit_rows=rows)
        logits = self.forward_step(plan)
        if while_running is not None:
            while_running()
        if not rows:
            return results
        if sample_rows:
            self._sample(logits, items, results, sample_rows)
        if lp_rows:
            input_logprobs_into(results, logits, items, lp_rows)
        return results

    def forward_step(self, plan: StepPlan, *, prev_ids: torch.Tensor | None = None) -> torch.Tensor | None:
        """One step without sampling: logits [len(rows), V] of the plan's logit rows (every row when None;
        none are computed when empty). A step replays a graph of its shape when one is captured (decode
        graphs end at every row's logits). The other tensor-parallel ranks run the step too (see tp_step.py).
        With a draft model the final hidden states [T, H] of an extend step stay in `last_hidden` for it.
        prev_ids [>= 1]: the previous step's sampled ids on the device, which the plan's prev_rows take."""
        if self.broadcast is not None:
            self.broadcast(step_message(self, plan, prev_ids))
            if prev_ids is not None:
                self.tp.broadcast(prev_ids.to(torch.int64).contiguous())
        rows = plan.logit_rows
        shape = self.graphs.shape_for(plan) if self.graphs is not None else None
        if shape is not None:
            logits = self.graphs.run(plan, shape, prev_ids=prev_ids)
            if rows is None or rows == list(range(plan.num_rows)):
                return logits
            return logits[self.inputs.logit_rows(rows)] if rows else None
        for graphs in (self.verify_graphs, self.extend_graphs):
            shape = graphs.shape_for(plan) if graphs is not None else None
            if shape is not None:
                hidden = graphs.run(plan, shape)
                break
        else:
            hidden = self.eager_forward(plan, prev_ids)
        if self.speculative is not None:
            self.last_hidden = hidden
        if rows is None:
            return self.model.compute_logits(hidden)
        if not rows:
            return None
        if rows == list(range(hidden.shape[0])):
            return self.model.compute_logits(hidden)
        return self.model.compute_logits(hidden[self.inputs.logit_rows(rows)])

    def eager_forward(self, plan: StepPlan, prev_ids: torch.Tensor | None = None, forward=None) -> torch.Tensor:
        """The plan's step without a graph: forward(fb) (the model's forward by default; [T, H] hidden states),
        fb the plan's ForwardBatch from the static step inputs (or one-off ones when it does not fit). Such a
        step waits on its host at decode sizes, so its linears run cuBLAS (triton_kernels/dense_linear.py)."""
        fits = self.inputs.fits(plan.num_tokens, plan.num_rows)
        inputs = self.inputs if fits else self._step_inputs(self.allocator, self.kv_pool, self.state_pool,
                                                            plan.num_tokens, plan.num_rows)
        with eager_step():
            return (forward or self.model)(inputs.eager_batch(plan, prev_ids=prev_ids))

    def _sample(self, logits, items, results, sample_rows) -> None:
        """Sample the rows (item, logits row) into their items' results, with the logprobs asked for."""
        idx = torch.tensor([r for _, r in sample_rows], device=self.device)
        reqs = [items[i].req for i, _ in sample_rows]
        chosen = logits[idx]
        mask = self._grammar_mask(reqs, chosen.shape[-1])
        next_ids = self.sampler(chosen, reqs, self.config.eos_token_ids, mask)
        sampled_into(results, chosen, next_ids, reqs, sample_rows, mask)
