"""ChatML pairs for the short chat phase, made from the training documents only:

- dialogue: in a scene, one character's speech as the user turn, the next character's reply as the
  assistant turn (speaker names and stage directions dropped);
- continuation: "Continue this passage:" and a few lines as the user turn, the lines that follow as the
  assistant turn (plays and Bible chapters).

Rendered with the chat template's layout; only the assistant's text and its <|im_end|> count for the loss."""

from __future__ import annotations

import random

from token_data import TokenStream, masked_stream

MAX_USER_CHARS = 400
MAX_REPLY_CHARS = 400
CONTINUATIONS_PER_DOCUMENT = 4


def speeches(scene: str) -> list[tuple[str, str]]:
    """(speaker, text) for each speech of a scene, in order."""
    out = []
    for block in scene.split("\n\n"):
        lines = block.split("\n")
        if len(lines) < 2 or not lines[0].endswith(":") or lines[0].startswith("["):
            continue
        text = "\n".join(line for line in lines[1:] if not line.startswith("["))
        if text:
            out.append((lines[0][:-1], text))
    return out


def dialogue_pairs(scene: str) -> list[tuple[str, str]]:
    said = speeches(scene)
    return [(a, b) for (who_a, a), (who_b, b) in zip(said, said[1:])
            if who_a != who_b and len(a) <= MAX_USER_CHARS and len(b) <= MAX_REPLY_CHARS]


def continuation_pairs(text: str, rng: random.Random) -> list[tuple[str, str]]:
    lines = [line for line in text.split("\n") if line and not line.startswith("[") and not line.endswith(":")]
    pairs = []
    for _ in range(CONTINUATIONS_PER_DOCUMENT):
        k = rng.randint(2, 4)
        if len(lines) < 2 * k + 1:
            break
        i = rng.randrange(1, len(lines) - 2 * k + 1)  # line 0 is a heading
        prompt, reply = "\n".join(lines[i:i + k]), "\n".join(lines[i + k:i + 2 * k])
        if len(prompt) <= MAX_USER_CHARS and len(reply) <= MAX_REPLY_CHARS:
            pairs.append(("Continue this passage:\n" + prompt, reply))
    return pairs


def all_pairs(documents: list[dict], seed: int) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    pairs = []
    for doc in documents:
        if doc["source"] == "shakespeare":
            pairs += dialogue_pairs(doc["text"])
        pairs += continuation_pairs(doc["text"], rng)
    rng.shuffle(pairs)
    return pairs


def chat_stream(tokenizer, documents: list[dict], seed: int) -> tuple[TokenStream, int]:
    """All pairs as one masked stream, and the number of pairs."""
    pairs = all_pairs(documents, seed)
    prompts = [f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n" for user, _ in pairs]
    replies = [f"{reply}<|im_end|>" for _, reply in pairs]
    enc_prompts = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    enc_replies = tokenizer(replies, add_special_tokens=False)["input_ids"]
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    pieces = []
    for prompt, reply in zip(enc_prompts, enc_replies):
        pieces += [(prompt, False), (reply, True), (newline, False)]
    return masked_stream(pieces), len(pairs)
