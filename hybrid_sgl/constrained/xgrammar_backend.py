"""The xgrammar backend: a GrammarCompiler over the tokenizer's vocabulary, one GrammarMatcher per
sequence. JSON allows at most MAX_JSON_WHITESPACE whitespace characters in a row, so a sampler that
favours spaces cannot spin inside an object until max_new_tokens.

Every grammar is compiled from EBNF whose negated character classes also exclude the surrogates
U+D800..U+DFFF. xgrammar matches their 3-byte encodings (ED A0..BF xx), which are not UTF-8: a
byte-level tokenizer could emit them one byte token at a time and the text would decode to three
U+FFFD, which breaks the constraint the client asked for (a JSON string's maxLength, for one)."""

from __future__ import annotations

import json
import re

import torch
import xgrammar as xgr

from hybrid_sgl.constrained.backend import ANY_JSON, GrammarBackend, GrammarError, GrammarKey, GrammarMatcher

MAX_JSON_WHITESPACE = 4
# xgrammar's character class for length-bounded JSON strings lets raw control characters through,
# which JSON forbids (json.loads rejects them); its unbounded strings already exclude them.
_BOUNDED_STRING_CHARS = '[^\\"\\\\\\r\\n]'
_JSON_STRING_CHARS = '[^\\0-\\x1f\\"\\\\\\r\\n]'
_SURROGATES = "\\uD800-\\uDFFF"
_LOG_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: (Check failed: .*? is false: )?")


class XGrammarMatcher(GrammarMatcher):
    def __init__(self, matcher: xgr.GrammarMatcher):
        self._m = matcher

    def accept(self, token: int) -> bool:
        return self._m.accept_token(token)

    def fill_mask(self, mask: torch.Tensor, row: int) -> None:
        self._m.fill_next_token_bitmask(mask, row)

    def rollback(self, num_tokens: int) -> None:
        self._m.rollback(num_tokens)

    def is_terminated(self) -> bool:
        return self._m.is_terminated()


class XGrammarBackend(GrammarBackend):
    def __init__(self, tokenizer, vocab_size: int, stop_token_ids: tuple[int, ...]):
        if tokenizer is None:
            raise ValueError("--grammar-backend xgrammar needs the tokenizer; drop --skip-tokenizer-init "
                             "or pass --grammar-backend none")
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=list(stop_token_ids) or None)
        self.vocab_size = vocab_size
        self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)  # GrammarCache caches

    def compile(self, key: GrammarKey) -> xgr.CompiledGrammar:
        try:
            if key.kind == "regex":
                ebnf = str(xgr.Grammar.from_regex(key.spec))
            elif key.kind == "ebnf":
                ebnf = key.spec
            elif key.kind == "json" and key.spec == ANY_JSON:
                ebnf = str(xgr.Grammar.builtin_json_grammar())
            elif key.kind == "json":
                json.loads(key.spec)  # a clearer message than the C++ parser's
                ebnf = _without_raw_control_chars(xgr.Grammar.from_json_schema(
                    key.spec, any_whitespace=True, max_whitespace_cnt=MAX_JSON_WHITESPACE))
            else:
                ebnf = str(xgr.Grammar.from_structural_tag(_structural_tag(key.spec)))
            return self._compiler.compile_grammar(without_surrogates(ebnf))
        except json.JSONDecodeError as e:
            raise GrammarError(f"{key.field} is not valid JSON: {e}") from None
        except (RuntimeError, ValueError, TypeError, KeyError) as e:
            raise GrammarError(f"invalid {key.field}: {_clean(str(e))}") from None

    def matcher(self, compiled: xgr.CompiledGrammar) -> XGrammarMatcher:
        return XGrammarMatcher(xgr.GrammarMatcher(compiled))


def _structural_tag(spec: str):
    """SGLang's legacy {"structures": [{"begin", "schema", "end"}], "triggers": [...]} or xgrammar's
    own structural tag JSON (with a "format" field), passed through."""
    tag = json.loads(spec)
    if isinstance(tag, dict) and "structures" in tag:
        items = [xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
                 for s in tag["structures"]]
        return xgr.StructuralTag.from_legacy_structural_tag(items, tag["triggers"])
    _bound_whitespace(tag)
    return json.dumps(tag)


def _bound_whitespace(node) -> None:
    """JSON inside a structural tag gets the same whitespace bound as a json_schema request, unless
    the tag sets its own."""
    if isinstance(node, dict):
        if node.get("type") == "json_schema" and node.get("max_whitespace_cnt") is None:
            node["max_whitespace_cnt"] = MAX_JSON_WHITESPACE
        for value in node.values():
            _bound_whitespace(value)
    elif isinstance(node, list):
        for value in node:
            _bound_whitespace(value)


def _without_raw_control_chars(grammar: xgr.Grammar) -> str:
    """The grammar as EBNF, its bounded-length JSON strings barred from raw U+0000..U+001F."""
    return str(grammar).replace(_BOUNDED_STRING_CHARS, _JSON_STRING_CHARS)


def without_surrogates(ebnf: str) -> str:
    """ebnf with U+D800..U+DFFF added to every negated character class ([^...] outside string
    literals and outside other classes)."""
    out, i, n = [], 0, len(ebnf)
    while i < n:
        if ebnf[i] in '"[':  # a string literal or a character class: up to its unescaped end
            end = '"' if ebnf[i] == '"' else "]"
            j = i + 1
            while j < n and ebnf[j] != end:
                j += 2 if ebnf[j] == "\\" else 1
            negated = ebnf.startswith("[^", i)
            out.append(ebnf[i:j] + (_SURROGATES if negated else "") + ebnf[j:j + 1])
            i = j + 1
        else:
            out.append(ebnf[i])
            i += 1
    return "".join(out)


def _clean(message: str) -> str:
    """xgrammar's C++ messages without their log prefix ("[12:00:00] /project/cpp/x.cc:94: ")."""
    return _LOG_PREFIX.sub("", message.strip().splitlines()[0] if message.strip() else message)
