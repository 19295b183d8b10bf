"""Engine: the in-process API (mirrors sglang.Engine), used by the HTTP server and tests.

    engine = Engine(model_path=..., dtype="float32", chunked_prefill_size=512)
    engine.generate("Hello", {"max_new_tokens": 8, "temperature": 0})
    engine.shutdown()

Requests run on the engine thread (EngineLoop); this class validates and tokenizes inputs,
hands requests over, and assembles SGLang-shaped outputs from the updates.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import queue
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import torch

from hybrid_sgl.config import ModelConfig
from hybrid_sgl.constrained import GrammarCache, GrammarError, grammar_cache, start_compile
from hybrid_sgl.constrained.cache import COMPILE_TIMEOUT_S
from hybrid_sgl.outputs import OutputState, chosen_ids
from hybrid_sgl.request_ids import RidRegistry, sequence_ids
from hybrid_sgl.runner.model_runner import ModelRunner
from hybrid_sgl.runner.tp_workers import TPWorkers
from hybrid_sgl.sampling_params import SamplingParams
from hybrid_sgl.scheduler.engine_loop import EngineLoop, ReqUpdate
from hybrid_sgl.scheduler.prefix_sharing import describe_placement, prefix_sharing_for
from hybrid_sgl.scheduler.request import Req
from hybrid_sgl.scheduler.scheduler import Scheduler
from hybrid_sgl.server_args import ServerArgs
from hybrid_sgl.submission import Prepared, Submission
from hybrid_sgl.tokenizer import StopStringChecker, load_tokenizer
from hybrid_sgl.version import __version__

logger = logging.getLogger(__name__)
PROMPT_CHARS_PER_TOKEN = 16  # a text prompt longer than this x the context length is refused untokenized
MAX_TOP_LOGPROBS_NUM = 100  # per position (OpenAI's chat API allows 20)
MAX_TOP_LOGPROB_ENTRIES = 1 << 20  # top-logprob entries one sequence may return (positions x top_logprobs_num)


@dataclass(frozen=True)
class EngineCapacity:
    """What the engine can take, fixed at start-up (Engine.capacity())."""

    context_length: int  # prompt + output tokens of one sequence
    max_total_tokens: int  # KV-cache capacity in tokens
    max_running_requests: int  # sequences that run at once (recurrent-state slots)
    max_prompt_chars: int  # a text prompt longer than this is refused before it is tokenized
    vocab_size: int  # token ids are in [0, vocab_size)


class Engine:
    def __init__(self, model_path: str | None = None, **server_args):
        args = ServerArgs(model_path=model_path, **server_args)
        _configure_logging(args.log_level)  # first: resolved() logs how it maps SGLang's values
        self.server_args = args = args.resolved()
        self.model_config = ModelConfig.from_hf(args.model_path)
        self.tokenizer = None if args.skip_tokenizer_init else load_tokenizer(args.tokenizer_path)
        self.tp_workers = None
        if args.tp_size > 1:  # ranks 1..N-1 in their own processes (resolved() checked the split); this is rank 0
            self.tp_workers = TPWorkers(args)
            try:
                self.runner = ModelRunner(args, self.model_config, self.tp_workers.group, self.tp_workers.send,
                                          self.tp_workers.pool_classes)
            except BaseException:  # the other ranks failed the same way, or wait for this one: stop them
                self.tp_workers.shutdown(timeout=2.0)
                raise
        else:
            self.runner = ModelRunner(args, self.model_config)
        # memory/ built the pools from the plan the runner profiled; the scheduler and the prefix cache get
        # them from here
        self.pools = self.runner.pools
        self.scheduler = Scheduler(self.runner, allocator=self.pools.allocator,
                                   chunked_prefill_size=args.chunked_prefill_size,
                                   stop_string_checker=StopStringChecker(self.tokenizer) if self.tokenizer else None,
                                   overlap=not args.disable_overlap_schedule,
                                   grammars=grammar_cache(args.grammar_backend, self.tokenizer,
                                                          self.model_config.vocab_size,
                                                          tuple(self.model_config.eos_token_ids)),
                                   sharing=prefix_sharing_for(self.pools, disable=args.disable_radix_cache,
                                                              snapshot_interval=args.snapshot_interval,
                                                              policy=args.schedule_policy))
        self.loop = EngineLoop(self.scheduler, decode_log_interval=args.decode_log_interval)
        # the objects of start-up (modules, weights' wrappers, graphs: ~350k) leave the cycle collector's
        # passes: each full pass over them would stall the engine thread ~0.1 s while serving
        gc.collect()
        gc.freeze()
        self.loop.start()
        self.rids = RidRegistry()
        self.max_prompt_chars = self.runner.context_length * PROMPT_CHARS_PER_TOKEN

    # ---- public API ------------------------------------------------------------------------------
    def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                 logprob_start_len=None, top_logprobs_num=None, stream: bool = False,
                 return_text_in_logprobs: bool = False, rid=None, token_ids_logprob=None):
        """prompt / input_ids: one or a batch. Returns a dict (single request, n = 1) or a list of
        dicts; with stream=True an iterator of dicts (batch items carry "index")."""
        prepared, single = self.prepare(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                        top_logprobs_num, return_text_in_logprobs, rid, token_ids_logprob)
        updates: queue.Queue = queue.Queue()
        self._submit(prepared, updates.put)
        if stream:
            return self._stream_sync(prepared, updates, single)
        self._wait_sync(prepared, updates)
        results = [p.out.to_dict() for p in prepared]
        return results[0] if single else results

    async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                             logprob_start_len=None, top_logprobs_num=None, stream: bool = False,
                             return_text_in_logprobs: bool = False, rid=None, token_ids_logprob=None):
        """Like generate; with stream=True returns an async iterator of dicts."""
        prepared, single = self.prepare(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                        top_logprobs_num, return_text_in_logprobs, rid, token_ids_logprob)
        gen = self.stream_updates(self.submit(prepared))
        if stream:
            return self._stream_async(gen, single)
        async for _ in gen:
            pass
        results = [p.out.to_dict() for p in prepared]
        return results[0] if single else results

    def shutdown(self) -> None:
        """Stop the engine thread (and the other tensor-parallel ranks), then give the device memory back:
        the weights, CUDA graphs and pools are dropped, so a next Engine in this process finds the device
        as this one found it."""
        self.loop.shutdown()
        if self.tp_workers is not None:
            self.tp_workers.shutdown()
            self.tp_workers = None
        if not self.loop.is_alive:  # else a step may still run on them
            self.runner.release()
            gc.unfreeze()  # (every engine's start-up objects: collected again from here on)
            gc.collect()
            if torch.cuda.is_available():
                _clear_cublas_workspaces()
                torch.cuda.empty_cache()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def abort(self, rid: str) -> int:
        """Abort every running sequence that answers to the client id `rid` (the request, each of its
        samples `rid-j` and batch items `rid-i`); returns how many were found."""
        internal = self.rids.internal_ids(rid)
        for i in internal:
            self.loop.abort(i)
        return len(internal)

    def run_on_engine(self, fn, timeout: float | None = 60.0):
        """Run fn(scheduler) on the engine thread between steps and return its result."""
        return self.loop.call(fn).result(timeout)

    def check_integrity(self) -> None:
        self.run_on_engine(lambda s: s.check_integrity())

    def flush_cache(self) -> bool:
        """Empty the prefix cache; False (nothing done) while requests run or wait."""
        return self.run_on_engine(lambda s: s.flush_cache())

    def server_info(self) -> dict:
        plan = self.runner.plan
        return {**vars(self.server_args),
                "version": __version__,
                "max_total_num_tokens": plan.max_total_tokens,
                "max_running_requests": plan.max_running_requests,
                "context_length": self.runner.context_length,
                "state_bytes_per_request": plan.state_bytes_per_request,
                "kv_bytes_per_token": plan.kv_bytes_per_token,
                "max_snapshots": plan.num_snapshots,
                "snapshot_bytes": plan.num_snapshots * plan.state_bytes_per_request,
                "snapshot_placement": ("off" if self.server_args.disable_radix_cache or not plan.state_bytes_per_request
                                       else describe_placement(self.server_args.snapshot_interval))}

    # ---- what the HTTP server reads: plain data, so that nothing outside needs the engine's parts ------
    def capacity(self) -> EngineCapacity:
        """The limits fixed at start-up: context length, KV-cache tokens, running sequences, prompt
        characters, vocabulary size."""
        plan = self.runner.plan
        return EngineCapacity(context_length=self.runner.context_length, max_total_tokens=plan.max_total_tokens,
                              max_running_requests=plan.max_running_requests, max_prompt_chars=self.max_prompt_chars,
                              vocab_size=self.model_config.vocab_size)

    def stats(self, check: bool = False, timeout: float | None = 60.0) -> dict:
        """The scheduler's and the pools' state, read on the engine thread between steps; ints:

            num_running_reqs            sequences holding a state slot
            num_waiting_reqs            sequences waiting to run, those whose grammar compiles included
            num_compiling_reqs          of those, the ones whose grammar still compiles
            num_pending_tokens          prompt tokens of the waiting sequences whose grammar is ready
            num_free_slots, num_slots   recurrent-state slots
            num_free_pages, num_pages, page_size
                                        KV pages (pages only the prefix cache holds count as used)
            num_preemptions             sequences retracted so far to free KV pages
            cached_pages, evictable_pages, num_snapshots, snapshot_slots, snapshot_bytes,
            snapshots_taken, snapshots_hit, cache_nodes, cache_hit_tokens, cache_lookup_tokens
                                        the prefix cache (zeros when it is off)
            computed_prompt_tokens      prompt tokens run through extend steps so far
            avg_spec_accept_length      tokens a verify step gains per request with drafts (float; 0.0 when off)

        check=True adds what a leak would show: integrity ("ok", or "violated: <why>" from the pools'
        and the prefix cache's invariants), open_sinks (sequences whose updates still have a
        receiver) and reserved_rids (client ids that running requests hold)."""
        return self.run_on_engine(lambda s: self._stats(s, check), timeout)

    async def async_stats(self, check: bool = False) -> dict:
        """stats() awaited on an asyncio loop, which stays free meanwhile."""
        return await asyncio.wrap_future(self.loop.call(lambda s: self._stats(s, check)))

    async def async_flush_cache(self) -> bool:
        """flush_cache() awaited on an asyncio loop, which stays free meanwhile."""
        return await asyncio.wrap_future(self.loop.call(lambda s: s.flush_cache()))

    async def grammar_ready(self, prepared: list[Prepared]) -> tuple[str, str] | None:
        """Wait (at most COMPILE_TIMEOUT_S, the asyncio loop stays free) until the grammars of
        `prepared` have compiled, so that a bad one is refused before anything is submitted. None
        when every grammar is usable or none is asked for; else (field, message) for the first that
        is not: the request field it came in ("regex", "json_schema", "ebnf", "structural_tag") and
        why (invalid, too slow to compile, or constrained decoding off on this engine)."""
        futures = {}
        for p in prepared:
            key = p.req.params.grammar_key
            if key is not None and key not in futures:
                futures[key] = start_compile(self.scheduler.grammars, key)
        pending = [asyncio.wrap_future(f) for f in futures.values() if not f.done()]
        # asyncio logs a failed future whose exception nobody read: read each wrapper's, the answer comes
        # from the compile's own future below
        for waiter in pending:
            waiter.add_done_callback(lambda w: w.cancelled() or w.exception())
        if pending:
            await asyncio.wait(pending, timeout=COMPILE_TIMEOUT_S)
        for key, future in futures.items():
            try:
                GrammarCache.compiled(future, key, timeout=0)
            except GrammarError as e:
                return key.field, str(e)
        return None

    def _stats(self, scheduler: Scheduler, check: bool) -> dict:  # on the engine thread
        a = scheduler.allocator
        stats = {"num_running_reqs": len(scheduler.running),
                 "num_waiting_reqs": len(scheduler.waiting) + len(scheduler.compiling),
                 "num_compiling_reqs": len(scheduler.compiling),
                 "num_pending_tokens": sum(len(req.prompt_ids) for req in scheduler.waiting),
                 "num_free_slots": a.num_free_slots, "num_slots": a.num_slots,
                 "num_free_pages": a.num_free_pages, "num_pages": a.num_pages, "page_size": a.page_size,
                 "num_preemptions": scheduler.num_preemptions, **scheduler.cache_stats()}
        if check:
            try:
                scheduler.check_integrity()
                stats["integrity"] = "ok"
            except AssertionError as e:
                stats["integrity"] = f"violated: {e}"
            stats["open_sinks"] = self.loop.num_sinks
            stats["reserved_rids"] = len(self.rids)
        return stats

    # ---- requests --------------------------------------------------------------------------------
    def prepare(self, prompt, sampling_params, input_ids, return_logprob, logprob_start_len, top_logprobs_num,
                return_text_in_logprobs, rid, token_ids_logprob=None) -> tuple[list[Prepared], bool]:
        """Validate and tokenize; one Prepared per generated sequence (prompt-major, n per prompt).
        Raises ValueError with the cause for any bad input. Thread-safe (the server calls it off
        the event loop)."""
        single, id_lists = self._prompt_ids(prompt, input_ids)
        count = len(id_lists)
        per = lambda value, name: _per_item(value, count, name)  # noqa: E731
        params_list = per(sampling_params, "sampling_params")
        lp_list, start_list = per(return_logprob, "return_logprob"), per(logprob_start_len, "logprob_start_len")
        top_list = per(top_logprobs_num, "top_logprobs_num")
        checked = []
        for i, ids in enumerate(id_lists):
            params = SamplingParams.from_dict(params_list[i])
            self._fit_default_max_new_tokens(params, params_list[i], len(ids))
            params.verify(self.model_config.vocab_size)
            if params.stop and self.tokenizer is None:
                raise ValueError("stop strings need a tokenizer; this server runs with skip_tokenizer_init")
            want_lp = bool(lp_list[i])
            start = self._logprob_start(start_list[i], len(ids), want_lp)
            top = self._top_logprobs(top_list[i], len(ids) - start + params.max_new_tokens if want_lp else 0)
            self.scheduler.validate(ids, params.max_new_tokens)
            checked.append((ids, params, want_lp, start, top))
        names = sequence_ids(rid, count, [c[1].n for c in checked], lambda: uuid.uuid4().hex)
        prepared = []
        for (ids, params, want_lp, start, top), seqs in zip(checked, names):
            for j, keys in enumerate(seqs):
                req = Req(rid=self.rids.new_internal_id(keys[-1]), prompt_ids=list(ids), params=params,
                          return_logprob=want_lp, logprob_start_len=start, top_logprobs_num=top,
                          token_ids_logprob=chosen_ids(token_ids_logprob, self.model_config.vocab_size))
                if params.sampling_seed is not None:
                    req.generator = torch.Generator(device=self.runner.device).manual_seed(
                        (params.sampling_seed + j) % (1 << 63))
                out = OutputState(rid=keys[-1], params=params, tokenizer=self.tokenizer, return_logprob=want_lp,
                                  top_logprobs_num=top, return_text_in_logprobs=bool(return_text_in_logprobs),
                                  token_ids_logprob=want_lp and req.token_ids_logprob is not None)
                prepared.append(Prepared(req, out, keys))
        return prepared, single and len(prepared) == 1

    def _prompt_ids(self, prompt, input_ids) -> tuple[bool, list[list[int]]]:
        """(single prompt?, token ids of each prompt); text longer than max_prompt_chars is refused
        before it is tokenized."""
        if (prompt is None) == (input_ids is None):
            raise ValueError("give exactly one of text/prompt and input_ids")
        if prompt is None:
            single = bool(input_ids) and all(isinstance(t, int) for t in input_ids)
            id_lists = [input_ids] if single else input_ids
            if not isinstance(id_lists, list) or not id_lists or not all(
                    isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)
                    for ids in id_lists):
                raise ValueError("input_ids must be a list of token ids or a non-empty list of such lists")
            return single, id_lists
        single = isinstance(prompt, str)
        texts = [prompt] if single else prompt
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("text must be a string or a non-empty list of strings")
        if self.tokenizer is None:
            raise ValueError("this server runs with skip_tokenizer_init: send input_ids, not text")
        for t in texts:
            if len(t) > self.max_prompt_chars:
                raise ValueError(f"the prompt has {len(t)} characters; at most {self.max_prompt_chars} are accepted "
                                 f"({PROMPT_CHARS_PER_TOKEN} per token of the context length "
                                 f"{self.runner.context_length}): shorten it or send input_ids")
        return single, [self.tokenizer.encode(t) for t in texts]

    def _fit_default_max_new_tokens(self, params: SamplingParams, given: dict | None, prompt_len: int) -> None:
        """Without an explicit max_new_tokens, the default shrinks to the room the context leaves
        (as in SGLang); an explicit value that does not fit stays an error."""
        if isinstance(given, dict) and given.get("max_new_tokens") is not None:
            return
        room = self.runner.context_length - prompt_len
        if 0 < room < params.max_new_tokens:
            params.max_new_tokens = room

    def _logprob_start(self, value, prompt_len: int, want: bool) -> int:
        if not want or value is None or value == -1:
            return prompt_len
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"logprob_start_len must be -1 or a non-negative integer, got {value!r}")
        if value > prompt_len:
            raise ValueError(f"logprob_start_len={value} is larger than the prompt ({prompt_len} tokens)")
        return value

    def _top_logprobs(self, value, positions: int) -> int:
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"top_logprobs_num must be a non-negative integer, got {value!r}")
        if value > MAX_TOP_LOGPROBS_NUM:
            raise ValueError(f"top_logprobs_num={value} is above the limit of {MAX_TOP_LOGPROBS_NUM}")
        if value * positions > MAX_TOP_LOGPROB_ENTRIES:
            raise ValueError(f"top_logprobs_num={value} over {positions} positions asks for {value * positions} "
                             f"entries; at most {MAX_TOP_LOGPROB_ENTRIES} are returned per sequence: lower "
                             "top_logprobs_num or max_new_tokens, or raise logprob_start_len")
        return value

    def _submit(self, prepared: list[Prepared], deliver) -> None:
        """Reserve the client ids (DuplicateRidError if a running request holds one) and hand the
        sequences to the engine; a sequence's ids are free again once its last update is out."""
        self.rids.reserve({p.req.rid: p.keys for p in prepared})

        def on_update(u: ReqUpdate) -> None:  # engine thread
            if u.finish_reason is not None:
                self.rids.release(u.rid)
            deliver(u)

        for p in prepared:
            self.loop.submit(p.req, on_update)

    def submit(self, prepared: list[Prepared]) -> Submission:
        """Hand prepared sequences to the engine from an asyncio loop (raises DuplicateRidError at
        once, before anything runs). The caller must close() the result when done."""
        sub = Submission(prepared, self.loop.abort)
        self._submit(prepared, sub.deliver)
        return sub

    # ---- waiting for results ---------------------------------------------------------------------
    def _wait_sync(self, prepared: list[Prepared], updates: queue.Queue) -> None:
        by_rid = {p.req.rid: p.out for p in prepared}
        pending = len(by_rid)
        while pending:
            u: ReqUpdate = updates.get()
            out = by_rid[u.rid]
            out.apply(u)
            pending -= out.finished

    def _stream_sync(self, prepared: list[Prepared], updates: queue.Queue, single: bool) -> Iterator[dict]:
        by_rid = {p.req.rid: (i, p.out) for i, p in enumerate(prepared)}
        pending = len(by_rid)
        try:
            while pending:
                u = updates.get()
                index, out = by_rid[u.rid]
                out.apply(u)
                pending -= out.finished
                yield _with_index(out.to_dict(stream=True), index, single)
        finally:
            for p in prepared:
                if not p.out.finished:
                    self.loop.abort(p.req.rid)

    async def stream_updates(self, sub: Submission) -> AsyncIterator[tuple[int, OutputState]]:
        """(index, output state) after each update; aborts what is unfinished if the consumer stops
        early (e.g. an HTTP client disconnects)."""
        try:
            async for item in sub.updates():
                yield item
        finally:
            sub.close()

    async def _stream_async(self, gen, single: bool) -> AsyncIterator[dict]:
        async for index, out in gen:
            yield _with_index(out.to_dict(stream=True), index, single)


def _per_item(value, count: int, name: str) -> list:
    if isinstance(value, list) and (name != "sampling_params" or all(isinstance(v, dict) for v in value)):
        if len(value) != count:
            raise ValueError(f"{name} has {len(value)} entries for {count} prompts")
        return value
    return [value] * count


def _with_index(d: dict, index: int, single: bool) -> dict:
    if not single:
        d["index"] = index
    return d


def _configure_logging(level: str) -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(format="[%(asctime)s.%(msecs)03d %(name)s] %(message)s",
                            datefmt="%H:%M:%S")
    logging.getLogger("hybrid_sgl").setLevel(level.upper())


def _clear_cublas_workspaces() -> None:
    """Free the workspaces torch keeps per cuBLAS handle and stream: every engine captures its CUDA graphs on
    new streams, so without this each engine started and shut down in a process left 32-64 MiB behind (H100).
    Safe beside another live engine: torch sets a handle's workspace again at each call, and a freed block is
    reused only on the stream it was last used on, after the calls queued there."""
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
