"""Compile grammars on a small thread pool, never on the engine thread; one compile per key.

`get(key)` returns a Future of the compiled grammar at once: a cached key's future is already done
(attaching costs a dict lookup), a new key's compile starts on the pool. `matcher(key, timeout)`
waits for it (on the caller's thread: a request's preparation, not the engine step) and makes the
request's own matcher. A failed compile stays cached as a failure, so a bad grammar sent again is
refused at once; a slow one keeps compiling after its request gave up and serves the next request.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from hybrid_sgl.constrained.backend import (
    GrammarBackend,
    GrammarError,
    GrammarKey,
    GrammarMatcher,
    make_grammar_backend,
)

COMPILE_TIMEOUT_S = 30.0
MAX_CACHED = 1024


class GrammarCache:
    def __init__(self, backend: GrammarBackend, workers: int = 2, max_cached: int = MAX_CACHED):
        self.backend = backend
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grammar-compile")
        self._futures: OrderedDict[GrammarKey, Future] = OrderedDict()
        self._lock = threading.Lock()
        self.max_cached = max_cached
        self.hits = self.misses = 0

    def get(self, key: GrammarKey) -> Future:
        with self._lock:
            future = self._futures.get(key)
            if future is not None:
                self.hits += 1
                self._futures.move_to_end(key)
                return future
            self.misses += 1
            future = self._pool.submit(self.backend.compile, key)
            self._futures[key] = future
            while len(self._futures) > self.max_cached:
                self._futures.popitem(last=False)
            return future

    def matcher(self, key: GrammarKey, timeout: float = COMPILE_TIMEOUT_S) -> GrammarMatcher:
        """A fresh matcher for key; GrammarError when the grammar is invalid or compiles too slowly."""
        return self.backend.matcher(self.compiled(self.get(key), key, timeout))

    @staticmethod
    def compiled(future: Future, key: GrammarKey, timeout: float = COMPILE_TIMEOUT_S) -> object:
        try:
            return future.result(timeout)
        except FutureTimeout:
            raise GrammarError(_too_slow(key, timeout)) from None

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def grammar_cache(backend: str, tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...]) -> GrammarCache | None:
    """The server's cache, or None when constrained decoding is off (backend "none", or no tokenizer)."""
    if tokenizer is None:
        return None
    made = make_grammar_backend(backend, tokenizer, vocab_size, stop_token_ids)
    return GrammarCache(made) if made is not None else None


def start_compile(cache: GrammarCache | None, key: GrammarKey) -> Future:
    """cache.get(key), or a failed future when constrained decoding is off."""
    if cache is not None:
        return cache.get(key)
    future: Future = Future()
    future.set_exception(GrammarError(f"{key.field} needs constrained decoding, which is off on this server "
                                      "(--grammar-backend none, or --skip-tokenizer-init)"))
    return future


def ready_matcher(cache: GrammarCache | None, key: GrammarKey, future: Future, since: float,
                  timeout: float = COMPILE_TIMEOUT_S) -> GrammarMatcher | None:
    """Without waiting: a matcher if the compile is done, None while it runs; GrammarError when it
    failed or has run longer than timeout since `since` (time.monotonic())."""
    if future.done():
        compiled = GrammarCache.compiled(future, key)  # raises for a failed compile (or no backend)
        return cache.backend.matcher(compiled)
    if time.monotonic() - since > timeout:
        raise GrammarError(_too_slow(key, timeout))
    return None


def _too_slow(key: GrammarKey, timeout: float) -> str:
    return (f"the {key.field} took more than {timeout:g} s to compile; simplify it (fewer alternatives, "
            "bounded repetition) or send it again later")
