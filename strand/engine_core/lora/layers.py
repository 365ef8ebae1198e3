"""The adapter slots of one Linear: stacked A and B for max_loras adapters, added to the
Linear's output by a forward hook for the tokens of the step that use them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from strand.engine_core.distributed.layers import RowParallelLinear
from strand.engine_core.lora.punica import LoRASegments, add_lora
from strand.kernels._triton import runs_triton


@dataclass(slots=True)
class LoRABatch:
    """The step's adapted tokens, shared by every adapted layer (set once per step)."""

    segments: LoRASegments | None = None  # None: no token of the step has an adapter
    # [num_tokens] int64 on the device, -1 for base-model tokens: the Triton kernel's input.
    token_slots: torch.Tensor | None = None


class LoRALayerSlots:
    """A fused Linear (q|k|v, gate|up) takes one adapter per output slice: slice s's A rows sit
    at [s * max_rank, s * max_rank + r) and its B at those columns and the slice's output rows,
    so one shrink and one expand cover every slice (the zero blocks add nothing).

    Under tensor parallelism the Linear is this rank's shard and the slots hold this rank's
    part of each adapter (lora/sharding.py)."""

    def __init__(self, linear: nn.Linear, slice_sizes: list[int], batch: LoRABatch,
                 max_loras: int, max_rank: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.in_features = linear.in_features
        self.slice_sizes = slice_sizes
        self.slice_offsets = [sum(slice_sizes[:i]) for i in range(len(slice_sizes))]
        self.max_rank = max_rank
        width = len(slice_sizes) * max_rank
        self.lora_a = torch.zeros(max_loras, width, self.in_features, device=device,
                                  dtype=dtype)  # [slots, slices * max_rank, in]
        self.lora_b = torch.zeros(max_loras, sum(slice_sizes), width, device=device,
                                  dtype=dtype)  # [slots, out, slices * max_rank]
        self.holds = [False] * max_loras  # slot s has weights for this layer
        self.batch = batch
        if isinstance(linear, RowParallelLinear):
            # Its input is this rank's slice, so the delta is a partial sum: before the
            # all-reduce (after it, every rank's delta would be added to the sum N times).
            linear.partial_hook = self._add_lora
        else:
            linear.register_forward_hook(self._add_lora)

    def clear(self, slot: int) -> None:
        if self.holds[slot]:
            self.lora_a[slot].zero_()
            self.lora_b[slot].zero_()
            self.holds[slot] = False

    def set(self, slot: int, slice_index: int, a: torch.Tensor, b: torch.Tensor) -> None:
        """a [r, in], b [slice out, r] (scaled) into slot's block for slice_index."""
        rank = a.shape[0]
        col = slice_index * self.max_rank
        row, size = self.slice_offsets[slice_index], self.slice_sizes[slice_index]
        self.lora_a[slot, col:col + rank].copy_(a)
        self.lora_b[slot, row:row + size, col:col + rank].copy_(b)
        self.holds[slot] = True

    def _add_lora(self, module: nn.Module, inputs: tuple[Any, ...],
                  output: torch.Tensor) -> torch.Tensor:
        segs = self.batch.segments
        if segs is None or not any(self.holds[slot] for slot in segs.slots):
            return output
        slots = self.batch.token_slots
        if slots is not None and runs_triton(output):
            # One launch pair for the whole batch (slots this layer lacks add zeros).
            from strand.kernels.lora import add_lora_triton

            add_lora_triton(output, inputs[0], self.lora_a, self.lora_b, slots)
        else:
            add_lora(output, inputs[0], self.lora_a, self.lora_b, segs, self.holds)
        return output
