"""Recurrent state of every linear-attention / SSM layer, one slot per running request.

conv  : [num_state_layers, rows, conv_width - 1, conv_dim]  (model dtype)
ssm   : [num_state_layers, rows, *ssm_shape]                (float32 by default)
rows = num_slots + 1 + num_snapshots + num_draft_rows. Slot `num_slots` (`pad_slot`) is never handed
out: padded batch rows point at it. The `num_snapshots` indices after it hold the prefix cache's
snapshots, then each slot's verify rows (speculative decoding: the state after each verified token);
same layout, never in a batch as slots.
Kernels update these tensors in place through slot indices.
"""

import torch

from hybrid_sgl.batch import device_index


class StatePool:
    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        conv_shape: tuple[int, int],
        conv_dtype: torch.dtype,
        ssm_shape: tuple[int, ...],
        ssm_dtype: torch.dtype,
        device: torch.device | str,
        num_snapshots: int = 0,
        num_draft_rows: int = 0,
    ):
        self.num_slots = num_slots
        self.pad_slot = num_slots
        rows = num_slots + 1 + num_snapshots + num_draft_rows
        self.conv = torch.zeros(num_layers, rows, *conv_shape, dtype=conv_dtype, device=device)
        self.ssm = torch.zeros(num_layers, rows, *ssm_shape, dtype=ssm_dtype, device=device)

    def release(self) -> None:
        """Give the slots' memory back (the engine has stopped)."""
        self.conv = self.ssm = torch.empty(0, device=self.conv.device)

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot's state over all layers."""
        return self.conv[:, 0].nbytes + self.ssm[:, 0].nbytes

    def copy_slot(self, src: int, dst: int) -> None:
        """State of every layer at index src -> dst (a device copy queued on the stream; no host wait)."""
        self.conv[:, dst].copy_(self.conv[:, src])
        self.ssm[:, dst].copy_(self.ssm[:, src])

    def copy_slots(self, src: list[int], dst: list[int], ssm: bool = True) -> None:
        """State of every layer at rows src[i] -> dst[i] (dst distinct, none of them a src): one gather and
        one scatter a tensor, queued on the stream (no host wait). ssm=False: the conv states only."""
        if not src:
            return
        src_t, dst_t = device_index(src, self.conv.device), device_index(dst, self.conv.device)
        self.conv.index_copy_(1, dst_t, self.conv.index_select(1, src_t))
        if ssm:
            self.ssm.index_copy_(1, dst_t, self.ssm.index_select(1, src_t))

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv [S+1, W-1, D], ssm [S+1, ...]) of state layer `index`, as views into the pool."""
        return self.conv[index], self.ssm[index]

    def copy_layer(self, index: int, src: torch.Tensor, dst: torch.Tensor) -> None:
        """State layer `index`: rows src -> dst ([n] int64 device tensors; no host wait)."""
        self.conv[index].index_copy_(0, dst, self.conv[index].index_select(0, src))
        self.ssm[index].index_copy_(0, dst, self.ssm[index].index_select(0, src))

    @staticmethod
    def bytes_per_slot(num_layers: int, conv_shape, conv_dtype, ssm_shape, ssm_dtype) -> int:
        conv = _numel(conv_shape) * torch.empty((), dtype=conv_dtype).element_size()
        ssm = _numel(ssm_shape) * torch.empty((), dtype=ssm_dtype).element_size()
        return num_layers * (conv + ssm)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
