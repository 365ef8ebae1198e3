"""nn.Linear whose CPU forward goes through oneDNN, or Strand's own kernel for a few rows
(strand/kernels/cpu_linear.py explains both), or for float32 (and the float32 copy of bfloat16 weights
where oneDNN has no bfloat16 kernels) on an AVX2 or AVX-512 CPU Strand's own GEMM on panels
(strand/kernels/cpu_linear_panels.py), or, with the panels switched off, on an AVX2-only CPU for a
decode batch of up to BATCH_M rows the dense kernel of strand/kernels/cpu_linear_batch.py.

After loading, `pack_linear_weights` gives each layer a packed copy of its weight (oneDNN's
blocked one, or the panels), made once instead of on every call. The dense weight stays where
the few-row kernel reads it (decode steps of up to SMALL_M requests: a read of the weights, 1.6x
oneDNN's speed at one row), or where another module shares it, as a tied lm_head shares the
embedding table; else it is released, so memory stays what it was. Keeping both costs the weights' size once more: the price of decode
speed at small batches.
"""

from __future__ import annotations

import torch
from torch import nn

from strand.kernels import cpu_linear_batch
from strand.kernels.cpu_linear import (
    SMALL_M,
    linear,
    linear_packed,
    linear_small,
    pack_weight,
    small_m_applies,
)


class Linear(nn.Linear):
    packed: torch.Tensor | None = None  # set by pack(): oneDNN's copy of the weight, or panels
    small_m: bool = False  # set by pack(): up to SMALL_M rows go to linear_small

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [num_tokens, in] -> [num_tokens, out]
        if (self.small_m and x.dim() == 2 and 0 < x.shape[0] <= SMALL_M
                and x.dtype == self.weight.dtype):
            return linear_small(x, self.weight, self.bias)
        if self.small_m and cpu_linear_batch.applies(x, self.weight):  # a decode batch, AVX2
            return cpu_linear_batch.linear_batch(x, self.weight, self.bias)
        if self.packed is not None:
            if self.packed.dtype != x.dtype:  # bfloat16 through a float32 copy (see pack)
                bias = None if self.bias is None else self.bias.float()
                return linear_packed(x.float(), self.packed, bias, self.out_features).to(x.dtype)
            return linear_packed(x, self.packed, self.bias, self.out_features)
        return linear(x, self.weight, self.bias)

    def pack(self, keep_dense: bool) -> bool:
        """Use the packed copy of the weight (cpu_linear.pack_weight) from now on, and the
        few-row kernel where it applies; False where no packed copy applies."""
        self.small_m = small_m_applies(self.weight)
        packed = pack_weight(self.weight)
        if packed is None and self.weight.dtype == torch.bfloat16 and self.weight.device.type == "cpu":
            # No oneDNN bfloat16 kernels on this CPU (AVX2-only): torch's own bfloat16 GEMM runs
            # at a sixth of float32's speed there. Products of many rows go through a float32
            # copy instead: bfloat16 inputs, float32 sums, one rounding, as a bfloat16 GEMM does.
            packed = pack_weight(self.weight.float())
        if packed is None:
            return False
        self.packed = packed
        if not keep_dense and not self.small_m:
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
