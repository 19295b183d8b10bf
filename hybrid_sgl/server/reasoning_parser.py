"""Reasoning parsers (--reasoning-parser): split a model's thinking from its answer.

qwen3: the output is `<think>reasoning</think>answer`. When the prompt already opened the block
(templates that end the generation prompt with `<think>\\n`), the output starts inside it. Text is
fed in pieces as it streams; a tag split across pieces is held back until it is whole.
"""

from __future__ import annotations

from dataclasses import dataclass

PARSERS = ("qwen3",)


@dataclass
class Split:
    reasoning: str = ""
    content: str = ""


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningParser:
    start, end = "<think>", "</think>"

    def __init__(self, name: str, in_reasoning: bool = False):
        if name not in PARSERS:
            raise ValueError(f"unknown reasoning parser {name!r}; choose one of {', '.join(PARSERS)}")
        self.state = "reasoning" if in_reasoning else "start"  # start -> reasoning -> content
        self._buf = ""
        self._fresh = in_reasoning  # strip the whitespace that follows a tag

    @staticmethod
    def prompt_opens_block(prompt_tail: str) -> bool:
        """The prompt ends inside an open `<think>` block."""
        return prompt_tail.rfind(ReasoningParser.start) > prompt_tail.rfind(ReasoningParser.end)

    def feed(self, delta: str) -> Split:
        """The reasoning and content text that `delta` completes."""
        self._buf += delta
        out = Split()
        while True:
            if self.state == "start":
                head = self._buf.lstrip()
                if head.startswith(self.start):
                    self._buf, self.state, self._fresh = head[len(self.start):], "reasoning", True
                    continue
                if head and not self.start.startswith(head):
                    self.state = "content"
                    continue
                return out
            if self._fresh:
                self._buf = self._buf.lstrip()
                self._fresh = not self._buf
            if self.state == "reasoning":
                i = self._buf.find(self.end)
                if i >= 0:
                    out.reasoning += self._buf[:i]
                    self._buf, self.state, self._fresh = self._buf[i + len(self.end):], "content", True
                    continue
                keep = _partial_suffix(self._buf, self.end)
                out.reasoning += self._buf[:len(self._buf) - keep]
                self._buf = self._buf[len(self._buf) - keep:]
                return out
            out.content += self._buf
            self._buf = ""
            return out

    def flush(self) -> Split:
        """What is still held back, at the end of the output."""
        rest, self._buf = self._buf, ""
        if self.state == "reasoning":
            return Split(reasoning=rest)
        return Split(content=rest)

    def parse(self, text: str) -> Split:
        """The whole output at once (reasoning and content stripped of surrounding whitespace)."""
        a, b = self.feed(text), self.flush()
        return Split((a.reasoning + b.reasoning).strip(), (a.content + b.content).strip())
