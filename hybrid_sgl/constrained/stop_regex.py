"""stop_regex: stop when the output text so far contains a match of one of the patterns."""

from __future__ import annotations

import re
from functools import lru_cache

WINDOW_TOKENS = 256  # a match must lie within the output's last WINDOW_TOKENS tokens


@lru_cache(maxsize=256)
def _compiled(pattern: str) -> re.Pattern:
    return re.compile(pattern)


def find_stop_regex(tokenizer, req) -> str | None:
    """The matched text of the first pattern found in the decoded tail of req's output, or None."""
    tail = tokenizer.decode(req.output_ids[-WINDOW_TOKENS:], skip_special_tokens=req.params.skip_special_tokens)
    for pattern in req.params.stop_regexes:
        match = _compiled(pattern).search(tail)
        if match is not None:
            return match.group(0)
    return None


def first_stop_regex_match(text: str, patterns: list[str]) -> int:
    """Where the earliest match of any pattern starts in text (len(text) when none matches)."""
    starts = [m.start() for m in (_compiled(p).search(text) for p in patterns) if m is not None]
    return min(starts, default=len(text))
