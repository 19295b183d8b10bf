"""The draft's small vocabulary (`--speculative-token-map`, SGLang's flag; the FR-Spec idea): the MTP drafts
choose among a fixed list of frequent token ids instead of the whole vocabulary, so each draft pass reads
K rows of `lm_head` instead of V (on Qwen3.5-9B, 32k of 248k rows: 0.27 GB instead of 2.0 GB a pass).
Verification still scores the whole vocabulary, so greedy output is unchanged; a token outside the list
can only come from the model's own token, never from a draft, which may shorten the accept length.

The file is what SGLang reads: a list or 1-D integer tensor saved with `torch.save` (`.pt`), or here also a
JSON list of ints (`.json`). `tools/token_map.py` writes one from a text corpus."""

from __future__ import annotations

import json
import os

import torch
import torch.nn.functional as F


def load_token_map(path: str, vocab_size: int) -> list[int]:
    """The token ids in `path`, checked: a non-empty list of distinct ints in [0, vocab_size). Raises
    ValueError naming the flag and what is wrong."""
    flag = f"--speculative-token-map {path}"
    if not os.path.isfile(path):
        raise ValueError(f"{flag}: no such file (a local .pt or .json list of token ids)")
    try:
        if path.endswith(".json"):
            with open(path) as f:
                ids = json.load(f)
        else:
            ids = torch.load(path, weights_only=True)
    except Exception as e:  # any unreadable file: say which and why
        raise ValueError(f"{flag}: cannot be read as a token list ({type(e).__name__}: {e})") from e
    if isinstance(ids, torch.Tensor):
        if ids.dim() != 1 or ids.dtype.is_floating_point or ids.dtype == torch.bool:
            raise ValueError(f"{flag}: a tensor of token ids must be 1-D integers, got {tuple(ids.shape)} {ids.dtype}")
        ids = ids.tolist()
    if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"{flag}: expected a non-empty list of integer token ids")
    bad = next((i for i in ids if not 0 <= i < vocab_size), None)
    if bad is not None:
        raise ValueError(f"{flag}: token id {bad} is outside the model's vocabulary [0, {vocab_size})")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{flag}: token ids repeat; each id may appear once")
    return ids


class DraftVocab:
    """ids: [K] token ids on the device; head: the lm_head rows of those ids, [K, H] (a copy, made once)."""

    def __init__(self, ids: list[int], lm_head_weight: torch.Tensor):
        self.ids = torch.tensor(ids, dtype=torch.int64, device=lm_head_weight.device)
        self.head = lm_head_weight[self.ids].contiguous()

    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> [N] the token id of the largest logit among the K (int64, on the device)."""
        return self.ids[F.linear(hidden, self.head).argmax(dim=-1)]

    @property
    def nbytes(self) -> int:
        return self.head.numel() * self.head.element_size() + self.ids.numel() * 8
