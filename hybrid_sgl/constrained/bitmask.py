"""Token bitmask buffers: the host fills one row per sampled request from its matcher, one copy
moves the rows to the device, and the sampler applies them.

Layout (xgrammar's): mask[row, w] is an int32 whose bit b allows token 32 * w + b; a row of all
ones (-1) allows every token, so unconstrained rows in a mixed batch cost nothing to fill.
Two host buffers are used in turn, like the runner's host token buffers: with the overlap
scheduler a step's mask may be filled while the previous step's copy is still queued.
"""

from __future__ import annotations

import torch

from hybrid_sgl.constrained.backend import GrammarMatcher


def mask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


class MaskBuffer:
    def __init__(self, max_rows: int, vocab_size: int, device: torch.device):
        self.vocab_size = vocab_size
        self.device = device
        shape = (max_rows, mask_words(vocab_size))
        pinned = device.type == "cuda"
        self._host = [torch.empty(shape, dtype=torch.int32, pin_memory=pinned) for _ in range(2)]
        self._turn = 0
        self._device = torch.empty(shape, dtype=torch.int32, device=device) if device.type != "cpu" else None

    def fill(self, matchers: list[GrammarMatcher | None]) -> torch.Tensor:
        """[len(matchers), words] int32 on the device: each matcher's allowed next tokens, or every
        token for None. The copy to the device is asynchronous on CUDA."""
        n = len(matchers)
        assert n <= self._host[0].shape[0], f"{n} rows exceed the mask buffer's {self._host[0].shape[0]}"
        self._turn ^= 1
        host = self._host[self._turn][:n]
        host.fill_(-1)
        for row, m in enumerate(matchers):
            if m is not None:
                m.fill_mask(host, row)
        if self._device is None:
            return host
        dev = self._device[:n]
        dev.copy_(host, non_blocking=True)
        return dev
