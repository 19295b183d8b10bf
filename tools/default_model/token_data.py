"""Token streams for training: documents joined into one stream, each preceded by <|endoftext|>, and
random windows drawn from it. A stream may carry a loss mask (chat data: only assistant tokens count)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

IGNORE = -100


def load_documents(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@dataclass
class TokenStream:
    ids: torch.Tensor  # [N] int64
    loss_mask: torch.Tensor | None = None  # [N] bool: whether predicting this token counts

    def __len__(self) -> int:
        return self.ids.numel()


def text_stream(tokenizer, texts: list[str]) -> TokenStream:
    eot = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return TokenStream(torch.tensor([t for ids in encoded for t in (eot, *ids)], dtype=torch.long))


def masked_stream(pieces: list[tuple[list[int], bool]]) -> TokenStream:
    """Concatenate (token ids, counts_for_loss) pieces."""
    ids = [t for piece, _ in pieces for t in piece]
    mask = [counts for piece, counts in pieces for _ in piece]
    return TokenStream(torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.bool))


def random_windows(stream: TokenStream, batch_size: int, seq_len: int, generator: torch.Generator):
    """(inputs [B, T], labels [B, T]): labels are the next tokens, IGNORE where the mask says so."""
    starts = torch.randint(0, len(stream) - seq_len - 1, (batch_size,), generator=generator)
    offsets = starts[:, None] + torch.arange(seq_len + 1)  # [B, T + 1]
    window = stream.ids[offsets]
    labels = window[:, 1:].clone()
    if stream.loss_mask is not None:
        labels[~stream.loss_mask[offsets[:, 1:]]] = IGNORE
    return window[:, :-1], labels


def consecutive_windows(stream: TokenStream, seq_len: int):
    """All non-overlapping windows in order: (inputs [W, T], labels [W, T]); the tail shorter than one
    window is dropped."""
    num = (len(stream) - 1) // seq_len
    ids = stream.ids[: num * seq_len + 1]
    return ids[:-1].view(num, seq_len), ids[1:].view(num, seq_len)
