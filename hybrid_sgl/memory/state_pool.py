"""Recurrent state of every linear-attention / SSM layer, one slot per running request.

conv  : [num_state_layers, num_slots + 1, conv_width - 1, conv_dim]  (model dtype)
ssm   : [num_state_layers, num_slots + 1, *ssm_shape]                (float32 by default)
The last slot (`pad_slot`) is never handed out: padded batch rows point at it.
Kernels update these tensors in place through slot indices.
"""

import torch


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
    ):
        self.num_slots = num_slots
        self.pad_slot = num_slots
        self.conv = torch.zeros(num_layers, num_slots + 1, *conv_shape, dtype=conv_dtype, device=device)
        self.ssm = torch.zeros(num_layers, num_slots + 1, *ssm_shape, dtype=ssm_dtype, device=device)

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv [S+1, W-1, D], ssm [S+1, ...]) of state layer `index`, as views into the pool."""
        return self.conv[index], self.ssm[index]

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
