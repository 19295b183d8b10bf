"""Paged KV cache for the full-attention layers only.

k, v : [num_attn_layers, num_pages + 1, page_size, num_kv_heads, head_dim]
Per layer this is vLLM's layout `[num_pages, page_size, num_kv_heads, head_dim]`, so a
borrowed kernel reads it without copies. The last page (`pad_page`) is never handed out:
padded batch rows write their K/V there.
"""

import torch


class KVPool:
    def __init__(
        self,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        self.num_pages = num_pages
        self.page_size = page_size
        self.pad_page = num_pages
        shape = (num_layers, num_pages + 1, page_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k_cache, v_cache) of attention layer `index`: [num_pages + 1, page_size, Hkv, D] each."""
        return self.k[index], self.v[index]

    def release(self) -> None:
        """Give the pages' memory back (the engine has stopped)."""
        self.k = self.v = torch.empty(0, device=self.k.device)

    def copy_page(self, src: int, dst: int) -> None:
        """K and V of page src -> dst in every layer (device copy, no host wait)."""
        self.k[:, dst].copy_(self.k[:, src])
        self.v[:, dst].copy_(self.v[:, src])

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
        return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
