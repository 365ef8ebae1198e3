"""nn.Linear whose CPU forward goes through Strand's own GEMM on panels (float32:
strand/kernels/cpu_linear_panels.py; bfloat16: strand/kernels/cpu_linear_panels_bf16.py) on an
AVX2 or AVX-512 CPU, or else through oneDNN, or Strand's own kernel for a few rows
(strand/kernels/cpu_linear.py explains both), or, with the panels switched off, on an AVX2-only
CPU for a decode batch of up to BATCH_M rows the dense kernel of strand/kernels/cpu_linear_batch.py.

After loading, `pack_linear_weights` gives each layer a packed copy of its weight (the panels,
or oneDNN's blocked one), made once instead of on every call, and the packed copy becomes the
only one wherever it can serve every row count:
- panels: their kernel at one to four rows reads the weights as fast as the few-row kernel
  reads the dense ones (each panel one contiguous stream), so the dense weight is released, its
  pages as they are packed. A tied lm_head's panels serve the embedding table too
  (layers/embedding.py).
- oneDNN's blocked copy (bfloat16 with native kernels, the panels switched off) and the float32
  copy of bfloat16 weights (AVX2, the same): the dense weight stays where the few-row kernel
  reads it (decode steps of up to SMALL_M requests, 1.6x oneDNN's speed at one row), at the
  price of a second copy.
STRAND_KEEP_DENSE_WEIGHTS=1 keeps the dense copy beside the panels (A/B runs). A weight another
module shares keeps its dense copy.
"""
from __future__ import annotations

import torch
from torch import nn

from strand import envs
from strand.engine_core.model_executor.cpu_allocator import trim_heap
from strand.kernels import cpu_linear_batch, cpu_linear_panels, cpu_linear_panels_bf16
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
            if self.packed.dtype == torch.float32 != x.dtype:  # bfloat16 through a float32 copy
                bias = None if self.bias is None else self.bias.float()
                return linear_packed(x.float(), self.packed, bias, self.out_features).to(x.dtype)
            return linear_packed(x, self.packed, self.bias, self.out_features)
        return linear(x, self.weight, self.bias)

    def pack(self, keep_dense: bool) -> bool:
        """Use the packed copy of the weight (cpu_linear.pack_weight) from now on, and the
        few-row kernel where it applies; False where no packed copy applies."""
        self.small_m = small_m_applies(self.weight)
        drops_dense = not keep_dense and self.panels_will_serve_all()
        packed = pack_weight(self.weight, release_source=drops_dense)
        if packed is None and self.weight.dtype == torch.bfloat16 and self.weight.device.type == "cpu":
            # No oneDNN bfloat16 kernels on this CPU (AVX2-only): torch's own bfloat16 GEMM runs
            # at a sixth of float32's speed there. Products of many rows go through a float32
            # copy instead: bfloat16 inputs, float32 sums, one rounding, as a bfloat16 GEMM does.
            packed = pack_weight(self.weight.float())
        if packed is None:
            return False
        self.packed = packed
        if keep_dense:
            return True
        if self.panels_serve_all(packed):
            self.small_m = False  # every row count on the panels: the dense copy goes
        if not self.small_m:
            self.drop_dense()
        return True

    def panels_will_serve_all(self) -> bool:
        """Whether pack() will make panels of this weight that serve every row count,
        so that the dense copy goes (and may go page by page as it is packed)."""
        return ((cpu_linear_panels.applies(self.weight)
                 or cpu_linear_panels_bf16.applies(self.weight))
                and not envs.keep_dense_weights())

    def panels_serve_all(self, packed: torch.Tensor) -> bool:
        """Whether `packed` is panels in this weight's dtype (their kernel takes every
        row count as fast as the dense kernels) and the dense copy is not asked to stay."""
        return (_is_panels(packed) and packed.dtype == self.weight.dtype
                and not envs.keep_dense_weights())

    def drop_dense(self) -> None:
        """Releases the dense weight; an empty meta tensor keeps the attribute (and its dtype)
        without the bytes."""
        self.small_m = False
        self.weight = nn.Parameter(torch.empty(0, device="meta", dtype=self.weight.dtype),
                                   requires_grad=False)

    @property
    def panels_only(self) -> bool:
        """The panels are this layer's only copy of its weight."""
        return self.packed is not None and _is_panels(self.packed) and self.weight.is_meta


def _is_panels(packed: torch.Tensor) -> bool:
    """float32 panels (cpu_linear_panels) or bfloat16 ones (cpu_linear_panels_bf16)."""
    return cpu_linear_panels.is_panels(packed) or cpu_linear_panels_bf16.is_panels(packed)


# Bytes of dense weights released between two trims of the heap while packing.
_TRIM_EVERY = 64 << 20


def pack_linear_weights(model: nn.Module) -> int:
    """Packs every Linear of an inference model; returns how many were packed. The heap pages
    the released dense weights leave go back to the system as packing proceeds, so the
    weights are never held twice over (peak RSS), only the last _TRIM_EVERY bytes of them."""
    uses = weight_uses(model)
    packed = released = 0
    for module in model.modules():
        if isinstance(module, Linear) and module.packed is None:
            before = module.weight.numel() * module.weight.element_size()
            packed += module.pack(keep_dense=uses.get(module.weight.data_ptr(), 0) > 1)
            released += before if module.weight.is_meta else 0
            if released >= _TRIM_EVERY:
                trim_heap()
                released = 0
    return packed


def weight_uses(model: nn.Module) -> dict[int, int]:
    """How many of the model's parameters start at each address: a weight used more than once
    (a tied table) keeps its dense bytes unless its every user is dealt with."""
    uses: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        uses[param.data_ptr()] = uses.get(param.data_ptr(), 0) + 1
    return uses
