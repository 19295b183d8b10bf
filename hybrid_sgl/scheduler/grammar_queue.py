"""Constrained requests (regex, JSON schema, EBNF) whose grammar is still compiling.

Compiles run on the grammar cache's threads, never on the engine thread (the server has usually
waited for them already). Each step the scheduler takes the requests whose grammar is ready into
its waiting queue; a grammar that is invalid or compiled too slowly finishes its request with a 400.
"""

from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, wait

from hybrid_sgl.constrained import GrammarCache, GrammarError, ready_matcher, start_compile
from hybrid_sgl.scheduler.request import Req


class CompilingQueue:
    def __init__(self, grammars: GrammarCache | None):
        self.grammars = grammars
        self.entries: list[tuple[Req, float]] = []  # (request, time.monotonic() when it came)

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, req: Req) -> None:
        req.grammar_future = start_compile(self.grammars, req.params.grammar_key)
        self.entries.append((req, time.monotonic()))

    def remove(self, rid: str) -> Req | None:
        for i, (req, _) in enumerate(self.entries):
            if req.rid == rid:
                del self.entries[i]
                return req
        return None

    def take_ready(self, idle: bool) -> tuple[list[Req], list[Req]]:
        """(requests whose matcher is ready, requests finished with their grammar's 400). When the
        engine is otherwise idle, waits up to 10 ms for a compile to end."""
        if idle:
            wait([r.grammar_future for r, _ in self.entries], timeout=0.01, return_when=FIRST_COMPLETED)
        ready, failed, still = [], [], []
        for req, since in self.entries:
            try:
                req.grammar = ready_matcher(self.grammars, req.params.grammar_key, req.grammar_future, since)
            except GrammarError as e:
                req.finish({"type": "abort", "message": str(e), "status_code": 400, "err_type": "BadRequest"})
                failed.append(req)
                continue
            if req.grammar is None:
                still.append((req, since))
            else:
                ready.append(req)
        self.entries = still
        return ready, failed
