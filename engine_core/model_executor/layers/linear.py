"""nn.Linear whose CPU forward goes through oneDNN (kernels/cpu_linear.py explains why).

After loading, `pack_linear_weights` swaps each layer's weight for oneDNN's blocked copy, made
once instead of on every call. The dense weight is released (the packed copy replaces it, so
memory stays what it was) unless another module shares it, as a tied lm_head shares the
embedding table.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.cpu_linear import linear, linear_packed, pack_weight


class Linear(nn.Linear):
    packed: torch.Tensor | None = None  # set by pack(); the weight is then not read

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, in] -> [num_tokens, out]
        if self.packed is not None:
            return linear_packed(x, self.packed, self.bias)
        return linear(x, self.weight, self.bias)

    def pack(self, keep_dense: bool) -> bool:
        """Use oneDNN's blocked copy of the weight from now on; False where it does not apply."""
        packed = pack_weight(self.weight)
        if packed is None:
            return False
        self.packed = packed
        if not keep_dense:
            # An empty meta tensor keeps the attribute (and in/out features) without the bytes.
            self.weight = nn.Parameter(torch.empty(0, device="meta", dtype=self.weight.dtype),
                                       requires_grad=False)
        return True


def pack_linear_weights(model: nn.Module) -> int:
    """Packs every Linear of an inference model; returns how many were packed."""
    uses: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        uses[param.data_ptr()] = uses.get(param.data_ptr(), 0) + 1
    packed = 0
    for module in model.modules():
        if isinstance(module, Linear) and module.packed is None:
            packed += module.pack(keep_dense=uses.get(module.weight.data_ptr(), 0) > 1)
    return packed
