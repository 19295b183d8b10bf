"""Tokenizer loading, incremental detokenization and stop-string matching."""

from __future__ import annotations

import os

from transformers import AutoTokenizer, PreTrainedTokenizerBase


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    if not os.path.isdir(path):
        raise FileNotFoundError(f"tokenizer path {path} is not a directory")
    return AutoTokenizer.from_pretrained(path)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without re-decoding everything and
    without emitting half of a multi-byte character.

    `prefix` is the start of the window that gives the tokens context; text is emitted only
    once it no longer ends in the replacement character (an incomplete UTF-8 sequence)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.kwargs = dict(skip_special_tokens=skip_special_tokens,
                           spaces_between_special_tokens=spaces_between_special_tokens)
        self.ids: list[int] = []
        self.text = ""
        self.prefix = 0
        self.read = 0

    def add(self, new_ids: list[int]) -> str:
        """Append tokens; returns the newly readable text (may be empty)."""
        self.ids.extend(new_ids)
        before = self.tokenizer.decode(self.ids[self.prefix:self.read], **self.kwargs)
        after = self.tokenizer.decode(self.ids[self.prefix:], **self.kwargs)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        delta = after[len(before):]
        self.prefix, self.read = self.read, len(self.ids)
        self.text += delta
        return delta


def find_stop(text: str, stops: list[str], start: int = 0) -> tuple[int, str] | None:
    """Earliest occurrence of any stop string in text[start:]: (index, stop) or None."""
    best = None
    for stop in stops:
        i = text.find(stop, start)
        if i != -1 and (best is None or i < best[0]):
            best = (i, stop)
    return best


def partial_stop_len(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a stop string (held back
    while streaming, so a client never sees the start of a stop string that then matches)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest


class StopStringChecker:
    """Called by the scheduler after each token of a request that has stop strings: decodes the
    tail of the output and returns the matched stop string, or None."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self.tokenizer = tokenizer

    def __call__(self, req) -> str | None:
        window = max(len(s) for s in req.params.stop) + 8  # a token decodes to >= 1 character
        tail = self.tokenizer.decode(req.output_ids[-window:], skip_special_tokens=req.params.skip_special_tokens)
        match = find_stop(tail, req.params.stop)
        return match[1] if match else None
