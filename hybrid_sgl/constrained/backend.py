"""The grammar backend contract and its registry.

A request's constraint is a GrammarKey (kind, spec): kind is one of KINDS, spec the text the user
sent (a regex, a JSON schema, an EBNF grammar, a structural tag as JSON). A backend compiles a key
into an opaque compiled grammar (shared by every request with that key) and makes one
GrammarMatcher per generated sequence from it.
"""

from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass

import torch

KINDS = ("regex", "json", "ebnf", "structural_tag")
ANY_JSON = "$$ANY$$"  # SGLang's json_schema for "any JSON value"
# name -> "module:class"; imported only when chosen
BACKENDS = {"xgrammar": "hybrid_sgl.constrained.xgrammar_backend:XGrammarBackend"}


class GrammarError(ValueError):
    """The grammar cannot be used (invalid, or too slow to compile); the message names which and why."""


@dataclass(frozen=True)
class GrammarKey:
    kind: str
    spec: str

    def __post_init__(self):
        assert self.kind in KINDS, f"unknown grammar kind {self.kind!r}; expected one of {KINDS}"

    @property
    def field(self) -> str:
        """The sampling_params field the spec came from (for error messages)."""
        return {"json": "json_schema"}.get(self.kind, self.kind)


def grammar_key(regex: str | None = None, json_schema: str | None = None, ebnf: str | None = None,
                structural_tag: str | None = None) -> GrammarKey | None:
    """The request's one constraint, or None. More than one is an error (SGLang allows one)."""
    given = [(k, v) for k, v in (("regex", regex), ("json", json_schema), ("ebnf", ebnf),
                                 ("structural_tag", structural_tag)) if v not in (None, "")]
    if len(given) > 1:
        names = ", ".join(GrammarKey(k, "").field for k, _ in given)
        raise GrammarError(f"give at most one of regex, json_schema, ebnf and structural_tag; got {names}")
    if not given:
        return None
    kind, spec = given[0]
    if not isinstance(spec, str):
        raise GrammarError(f"{GrammarKey(kind, '').field} must be a string, got {type(spec).__name__}")
    return GrammarKey(kind, spec)


class GrammarMatcher(abc.ABC):
    """One sequence's position in its grammar. Not thread-safe: used on the engine thread only."""

    @abc.abstractmethod
    def accept(self, token: int) -> bool:
        """Advance by one sampled token; False if the grammar does not allow it."""

    @abc.abstractmethod
    def fill_mask(self, mask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens as bits into mask[row] (mask: [rows, words] int32, CPU)."""

    @abc.abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last num_tokens accepted tokens (speculative decoding checks drafts and takes them back)."""

    @abc.abstractmethod
    def is_terminated(self) -> bool:
        """The grammar has ended (its stop token was accepted): nothing more may be generated."""


class GrammarBackend(abc.ABC):
    """Compiles keys (thread-safe: called from the compile pool) and makes matchers."""

    vocab_size: int

    @abc.abstractmethod
    def compile(self, key: GrammarKey) -> object:
        """The compiled grammar; GrammarError naming the problem when the spec is invalid."""

    @abc.abstractmethod
    def matcher(self, compiled: object) -> GrammarMatcher:
        ...


def make_grammar_backend(name: str, tokenizer, vocab_size: int,
                         stop_token_ids: tuple[int, ...]) -> GrammarBackend | None:
    """The backend called `name`, or None for "none" (constrained requests are then refused)."""
    if name == "none":
        return None
    if name not in BACKENDS:
        raise ValueError(f"grammar backend {name!r} is not available; choose one of {sorted(BACKENDS)} or none")
    module, cls = BACKENDS[name].split(":")
    try:
        backend_cls = getattr(importlib.import_module(module), cls)
    except ImportError as e:
        raise ValueError(f"--grammar-backend {name} needs the {name} package ({e}); "
                         f"pip install {name}, or pass --grammar-backend none") from None
    return backend_cls(tokenizer, vocab_size, stop_token_ids)
