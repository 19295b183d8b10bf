"""Requests for the load generator: random token ids of chosen lengths, or a ShareGPT-style file.

Prompts are always sent as token ids, so a server without a tokenizer (random weights,
--skip-tokenizer-init) serves them too.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

CHARS_PER_TOKEN = 4  # length estimate when the server has no tokenizer


@dataclass(frozen=True)
class BenchRequest:
    prompt_ids: list[int]
    output_len: int

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)


def random_requests(num: int, input_len: int, output_len: int, range_ratio: float, vocab_size: int,
                    seed: int) -> list[BenchRequest]:
    """Lengths uniform in [max(1, len * range_ratio), len] (range_ratio 1: all exactly len); ids
    uniform over the vocabulary."""
    rng = random.Random(seed)

    def length(full: int) -> int:
        return rng.randint(max(1, int(full * range_ratio)), full)

    return [BenchRequest([rng.randrange(vocab_size) for _ in range(length(input_len))], length(output_len))
            for _ in range(num)]


async def sharegpt_requests(path: str, num: int, tokenize, vocab_size: int, context_length: int, seed: int,
                            output_len: int | None = None) -> tuple[list[BenchRequest], str]:
    """The first human turn of each conversation as the prompt, the reply's length as the output
    length (or `output_len`). tokenize: async (list[str]) -> list[list[int]], or None when the
    server has no tokenizer: then lengths are characters / CHARS_PER_TOKEN and the ids random.
    Conversations shorter than 4 tokens either way or longer than the context are left out, as
    SGLang's bench_serving does. Returns (requests, how lengths were counted)."""
    with open(path) as f:
        data = json.load(f)
    pairs = []
    for item in data:
        turns = item.get("conversations") or item.get("conversation") or []
        if len(turns) >= 2:
            pairs.append((_text(turns[0]), _text(turns[1])))
    random.Random(seed).shuffle(pairs)
    rng = random.Random(seed + 1)
    counted = "server tokenizer" if tokenize else f"characters / {CHARS_PER_TOKEN} (server has no tokenizer)"
    requests: list[BenchRequest] = []
    for start in range(0, len(pairs), 256):
        chunk = pairs[start:start + 256]
        if tokenize:
            prompts = await tokenize([p for p, _ in chunk])
            replies = [len(ids) for ids in await tokenize([r for _, r in chunk])]
        else:
            prompts = [[rng.randrange(vocab_size) for _ in range(len(p) // CHARS_PER_TOKEN)] for p, _ in chunk]
            replies = [len(r) // CHARS_PER_TOKEN for _, r in chunk]
        for ids, reply in zip(prompts, replies):
            out = output_len or reply
            if len(ids) < 4 or out < 4 or len(ids) + out > context_length:
                continue
            requests.append(BenchRequest(ids, out))
            if len(requests) == num:
                return requests, counted
    return requests, counted


def _text(turn) -> str:
    if isinstance(turn, dict):
        return turn.get("value") or turn.get("content") or ""
    return str(turn)
