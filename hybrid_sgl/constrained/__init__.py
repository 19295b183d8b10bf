"""Structured generation: grammars (regex, JSON schema, EBNF, structural tags) that constrain
which tokens a request may sample next.

    backend.py          GrammarBackend contract, GrammarKey, the registry of backends
    xgrammar_backend.py the default backend (xgrammar)
    cache.py            compile off the engine thread, cached by key; errors name the cause
    bitmask.py          per-step token bitmask buffers (host, then device) for a batch's rows

The sampler only applies the device mask it is given (runner/sampler.apply_token_bitmask).
"""

from hybrid_sgl.constrained.backend import (
    GrammarBackend,
    GrammarError,
    GrammarKey,
    GrammarMatcher,
    grammar_key,
    make_grammar_backend,
)
from hybrid_sgl.constrained.bitmask import MaskBuffer
from hybrid_sgl.constrained.cache import GrammarCache, grammar_cache, ready_matcher, start_compile

__all__ = ["GrammarBackend", "GrammarCache", "GrammarError", "GrammarKey", "GrammarMatcher", "MaskBuffer",
           "grammar_cache", "grammar_key", "make_grammar_backend", "ready_matcher", "start_compile"]
