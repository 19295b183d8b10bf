"""EngineLoop: the scheduler on its own thread.

Requests come in through `submit` / `abort` (any thread); after every step each changed
request's news goes out as a ReqUpdate through the callback given at submit, called on the
engine thread (callbacks must only hand the update over, e.g. to a queue). `call` runs a
function on the engine thread between steps (stats, cache flush, integrity checks).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from hybrid_sgl.scheduler.request import Req
from hybrid_sgl.scheduler.scheduler import Scheduler
from hybrid_sgl.scheduler.step_log import DECODE_LOG_INTERVAL, StepLog

logger = logging.getLogger(__name__)


@dataclass
class ReqUpdate:
    rid: str
    new_ids: list[int]
    new_logprobs: list[tuple[float, int]]
    new_top_logprobs: list[list]
    input_logprobs: list[tuple[float | None, int]] | None  # complete list, sent once
    input_top_logprobs: list | None
    finish_reason: dict | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    queue_time: float | None  # seconds from arrival to first being scheduled; None while waiting
    new_token_ids_logprobs: list = field(default_factory=list)  # token_ids_logprob, new positions
    input_token_ids_logprobs: list | None = None  # complete list, sent once with input_logprobs
    spec_verify_ct: int | None = None  # verify steps with drafts so far (None: speculative decoding is off)


class _Sink:
    def __init__(self, callback: Callable[[ReqUpdate], None]):
        self.callback = callback
        self.sent = 0
        self.input_sent = False
        self.queue_time: float | None = None


class EngineLoop:
    def __init__(self, scheduler: Scheduler, decode_log_interval: int = DECODE_LOG_INTERVAL):
        self.scheduler = scheduler
        self.speculative = getattr(scheduler.runner, "speculative", None) is not None
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._sinks: dict[str, _Sink] = {}
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self.step_count = 0
        self.generated_tokens = 0
        scheduler.on_batch = StepLog(scheduler, lambda: self.generated_tokens, decode_log_interval).batch

    def start(self) -> None:
        self._thread.start()

    @property
    def num_sinks(self) -> int:
        """Requests whose updates still have somewhere to go (read on the engine thread)."""
        return len(self._sinks)

    def submit(self, req: Req, callback: Callable[[ReqUpdate], None]) -> None:
        self._inbox.put(("add", req, callback))

    def abort(self, rid: str) -> None:
        self._inbox.put(("abort", rid, None))

    def call(self, fn: Callable[[Scheduler], object]) -> Future:
        future: Future = Future()
        self._inbox.put(("call", fn, future))
        return future

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopped.set()
        self._inbox.put(("wake", None, None))
        if self._thread.is_alive():
            self._thread.join(timeout)

    # ---- engine thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopped.is_set():
            self._drain(block=not self.scheduler.has_work)
            if self._stopped.is_set() or not self.scheduler.has_work:
                continue
            try:
                changed = self.scheduler.step()
            except Exception:  # a bug or a device error: fail the running requests, keep serving
                logger.error("engine step failed:\n%s", traceback.format_exc())
                self._fail_all("internal error in the engine step; see the server log")
                continue
            self.step_count += 1
            self._note_scheduled()
            for req in changed:
                self._emit(req)

    def _drain(self, block: bool) -> None:
        while True:
            try:
                kind, a, b = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            if kind == "add":
                self._sinks[a.rid] = _Sink(b)
                a.arrival_time = time.monotonic()
                try:
                    self.scheduler.add(a)
                except ValueError as e:  # Engine.prepare validates first; this only guards the thread
                    a.finish({"type": "abort", "message": str(e), "status_code": 400, "err_type": "BadRequest"})
                    self._emit(a)
            elif kind == "abort":
                req = self.scheduler.abort(a)
                if req is not None:
                    self._emit(req)
            elif kind == "call":
                try:
                    b.set_result(a(self.scheduler))
                except Exception as e:  # returned to the caller
                    b.set_exception(e)

    def _note_scheduled(self) -> None:
        now = time.monotonic()
        for req in self.scheduler.running:
            sink = self._sinks.get(req.rid)
            if sink is not None and sink.queue_time is None:
                sink.queue_time = now - req.arrival_time

    def _fail_all(self, message: str) -> None:
        self.scheduler.drop_in_flight()
        for req in list(self.scheduler.running) + list(self.scheduler.waiting):
            self.scheduler.abort(req.rid)
            req.finish({"type": "abort", "message": message, "status_code": 500, "err_type": "InternalError"})
            self._emit(req)

    def _emit(self, req: Req) -> None:
        sink = self._sinks.get(req.rid)
        if sink is None:
            return
        new = slice(sink.sent, len(req.output_ids))
        if sink.queue_time is None and req.output_ids:  # admitted and finished within one step
            sink.queue_time = time.monotonic() - req.arrival_time
        send_input = (not sink.input_sent and req.return_logprob
                      and (not req.wants_input_logprobs() or req.finished))
        update = ReqUpdate(
            rid=req.rid,
            new_ids=req.output_ids[new],
            new_logprobs=req.output_token_logprobs[new] if req.return_logprob else [],
            new_top_logprobs=req.output_top_logprobs[new] if req.return_logprob else [],
            input_logprobs=list(req.input_token_logprobs) if send_input else None,
            input_top_logprobs=list(req.input_top_logprobs) if send_input else None,
            finish_reason=req.finish_reason if req.finished else None,
            prompt_tokens=len(req.prompt_ids),
            completion_tokens=len(req.output_ids),
            cached_tokens=req.cached_tokens,
            queue_time=sink.queue_time,
            new_token_ids_logprobs=req.output_token_ids_logprobs[new] if req.token_ids_logprob else [],
            input_token_ids_logprobs=list(req.input_token_ids_logprobs) if send_input else None,
            spec_verify_ct=req.spec_verify_ct if self.speculative else None,
        )
        self.generated_tokens += len(update.new_ids)
        sink.sent = len(req.output_ids)
        sink.input_sent = sink.input_sent or send_input
        if req.finished:
            del self._sinks[req.rid]
        try:
            sink.callback(update)
        except Exception:
            logger.error("output callback for %s failed:\n%s", req.rid, traceback.format_exc())
