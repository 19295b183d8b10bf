"""The batch lines of the server log, at info level, worded as SGLang's (users grep them):

    Prefill batch. #new-seq: 2, #new-token: 512, #cached-token: 128, token usage: 0.05, #running-req: 3, #queue-req: 0
    Decode batch. #running-req: 8, #token: 4096, token usage: 0.10, gen throughput (token/s): 812.3, #queue-req: 0

One prefill line per extend step and one decode line every `decode_interval` decode steps, written
when the step is scheduled. Every figure is host bookkeeping the scheduler keeps anyway (no device
work, no sync):

    #new-seq        requests in the prefill step (new ones and prompts continuing in chunks)
    #new-token      prompt tokens the step computes
    #cached-token   prompt tokens the new requests of the step took from the prefix cache
    #running-req    prefill: requests running besides those of the step; decode: the batch size
    #token          KV tokens the running requests hold once the step has run (a shared prefix
                    counts once per request)
    token usage     #token over the KV-cache capacity
    gen throughput  tokens generated per second since the previous decode line (or since decoding
                    resumed, after a time with nothing decoding)
    #queue-req      requests waiting, those whose grammar still compiles included
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from hybrid_sgl.batch import ForwardMode
from hybrid_sgl.runner.model_runner import BatchItem

logger = logging.getLogger(__name__)
DECODE_LOG_INTERVAL = 40  # decode steps per decode line, as SGLang's --decode-log-interval


class StepLog:
    def __init__(self, scheduler, generated_tokens: Callable[[], int], decode_interval: int = DECODE_LOG_INTERVAL):
        """scheduler: the Scheduler whose steps are logged; generated_tokens(): tokens generated so far."""
        self.scheduler = scheduler
        self.generated_tokens = generated_tokens
        self.decode_interval = max(1, decode_interval)
        self.capacity = scheduler.allocator.num_pages * scheduler.allocator.page_size
        self.decode_steps = 0
        self._since: tuple[float, int] | None = None  # (time, tokens generated) where the throughput window starts

    def batch(self, mode: ForwardMode, items: list[BatchItem]) -> None:
        """A step is about to run `items` in `mode`."""
        if mode is ForwardMode.EXTEND:
            if len(self.scheduler.running) == len(items):  # nothing decodes: idle time stays out of the throughput
                self._since = None
            if logger.isEnabledFor(logging.INFO):
                logger.info(self.prefill_line(items))
            return
        self.decode_steps += 1
        if self._since is None:
            self._since = (time.monotonic(), self.generated_tokens())
        if self.decode_steps % self.decode_interval == 0:
            if logger.isEnabledFor(logging.INFO):
                logger.info(self.decode_line(items))
            self._since = (time.monotonic(), self.generated_tokens())

    def prefill_line(self, items: list[BatchItem]) -> str:
        s = self.scheduler
        new_tokens = sum(it.end - it.start for it in items)
        cached = sum(it.start for it in items if it.start == it.req.cached_tokens)  # a request's first chunk
        return (f"Prefill batch. #new-seq: {len(items)}, #new-token: {new_tokens}, #cached-token: {cached}, "
                f"token usage: {self._usage(self._kv_tokens(items)):.2f}, "
                f"#running-req: {len(s.running) - len(items)}, #queue-req: {self._queued()}")

    def decode_line(self, items: list[BatchItem]) -> str:
        tokens = self._kv_tokens(items)
        return (f"Decode batch. #running-req: {len(items)}, #token: {tokens}, "
                f"token usage: {self._usage(tokens):.2f}, gen throughput (token/s): {self._throughput():.2f}, "
                f"#queue-req: {self._queued()}")

    def _kv_tokens(self, items: list[BatchItem]) -> int:
        return sum(r.num_computed for r in self.scheduler.running) + sum(it.end - it.start for it in items)

    def _usage(self, tokens: int) -> float:
        return tokens / max(self.capacity, 1)

    def _queued(self) -> int:
        return len(self.scheduler.waiting) + len(self.scheduler.compiling)

    def _throughput(self) -> float:
        if self._since is None:
            return 0.0
        start, tokens = self._since
        elapsed = time.monotonic() - start
        return (self.generated_tokens() - tokens) / elapsed if elapsed > 0 else 0.0
