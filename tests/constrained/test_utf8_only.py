"""Constrained text is UTF-8. xgrammar alone matches the 3-byte encodings of the surrogates
U+D800..U+DFFF (ED A0..BF xx). A byte-level tokenizer can emit them one byte token at a time; the
client then decodes three U+FFFD, and a JSON string of maxLength 8 came back 10 characters long.
Every kind of grammar the backend compiles now refuses them, and still takes real multi-byte
characters."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr

from hybrid_sgl.constrained import GrammarKey
from hybrid_sgl.constrained.backend import ANY_JSON
from hybrid_sgl.constrained.xgrammar_backend import XGrammarBackend, without_surrogates
from hybrid_sgl.testing.tiny_checkpoint import make_tokenizer

SCHEMA = json.dumps({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}},
                     "required": ["name"]})
TAG = json.dumps({"structures": [{"begin": "<f>", "schema": {"type": "object", "properties": {"s": {"type": "string"}}},
                                  "end": "</f>"}], "triggers": ["<f>"]})
# (kind, spec, the bytes that open a string in which any character may follow)
GRAMMARS = [
    ("json", SCHEMA, b'{"name": "'),
    ("json", ANY_JSON, b'{"'),
    ("regex", r'"[^"]{0,8}"', b'"'),
    ("ebnf", 'root ::= "\\"" [^"]* "\\""', b'"'),
    ("structural_tag", TAG, b'<f>{"s": "'),
]
SURROGATES = [b"\xed\xa0\x80", b"\xed\xbf\xbf"]  # U+D800, U+DFFF
REAL = [b"\xed\x9f\xbf", b"\xee\x80\x80", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\xc3\xa9"]  # U+D7FF, U+E000, ...


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """(backend, {byte: its single-byte token id})."""
    tok = make_tokenizer(str(tmp_path_factory.mktemp("tok")))
    vocab = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok)).decoded_vocab
    return XGrammarBackend(tok, len(tok), (tok.eos_token_id,)), {b[0]: i for i, b in enumerate(vocab) if len(b) == 1}


def _accepts(compiled, kind: str, spec: str, prefix: bytes, data: bytes) -> bool:
    backend, byte_token = compiled
    matcher = backend.matcher(backend.compile(GrammarKey(kind, spec)))
    assert all(matcher.accept(byte_token[b]) for b in prefix), "the prefix opens a string"
    return all(matcher.accept(byte_token[b]) for b in data)


@pytest.mark.parametrize("kind,spec,prefix", GRAMMARS, ids=[g[0] + str(i) for i, g in enumerate(GRAMMARS)])
def test_surrogates_are_refused_and_real_characters_taken(compiled, kind, spec, prefix):
    for data in SURROGATES:
        assert not _accepts(compiled, kind, spec, prefix, data), data
    for data in REAL:
        assert _accepts(compiled, kind, spec, prefix, data), data


def test_without_surrogates_patches_negated_classes_only():
    """Negated classes gain the range; string literals and positive classes (even holding '"', '[^'
    or an escaped ']') stay as written."""
    ebnf = r'root ::= "[^x]" [^a\]"] [a"^] "\"[^" [^\\]'
    assert without_surrogates(ebnf) == (r'root ::= "[^x]" [^a\]"\uD800-\uDFFF] [a"^] "\"[^" '
                                        r'[^\\\uD800-\uDFFF]')
