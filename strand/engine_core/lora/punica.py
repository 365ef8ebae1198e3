"""Batched LoRA over a mixed batch (punica's shrink/expand, segmented), in torch.

Every token of a step carries an adapter slot (or none). Once per step the adapted tokens are
sorted by slot (LoRASegments: one gather index, one contiguous segment per adapter); each
adapted Linear then gathers those rows once, runs two small products per segment into one delta
and scatters it back once. Base-model tokens' rows are never touched. A batch on one adapter
skips the gather and the scatter. On CUDA the layers take strand/kernels/lora.py (Triton, per token)
instead; strand/kernels/lora_ref.py is the reference both are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class LoRASegments:
    # [k] int64 on the device: the adapted token rows, grouped by slot. None: every row of the
    # batch, all on segments[0]'s slot.
    rows: torch.Tensor | None
    segments: list[tuple[int, int, int]]  # (slot, start, length) into rows, one per slot

    @property
    def slots(self) -> list[int]:
        return [slot for slot, _, _ in self.segments]


def add_lora(
    out: torch.Tensor,  # [num_tokens, out_features], updated in place
    x: torch.Tensor,  # [num_tokens, in_features]
    lora_a: torch.Tensor,  # [num_slots, rank, in_features]
    lora_b: torch.Tensor,  # [num_slots, out_features, rank] (scaling folded in)
    segs: LoRASegments,
    held: list[bool] | None = None,  # per slot: this layer has weights there (None: all)
) -> torch.Tensor:
    if segs.rows is None:  # the whole batch on one adapter: no gather, no scatter
        slot = segs.segments[0][0]
        out.addmm_(x @ lora_a[slot].t(), lora_b[slot].t())
        return out
    xs = x.index_select(0, segs.rows)  # [k, in]
    delta = torch.empty(len(segs.rows), out.shape[1], dtype=out.dtype, device=out.device)
    for slot, start, length in segs.segments:
        rows = delta.narrow(0, start, length)
        if held is not None and not held[slot]:
            rows.zero_()
            continue
        torch.mm(xs.narrow(0, start, length) @ lora_a[slot].t(), lora_b[slot].t(), out=rows)
    # index_put_, not index_add_: on CPU index_add_ wakes the OpenMP team even for a few rows,
    # milliseconds a call on a busy machine (index_put_: microseconds). Rows are distinct.
    out.index_put_((segs.rows,), delta, accumulate=True)
    return out


def make_segments(token_slots: torch.Tensor, device: torch.device) -> LoRASegments | None:
    """token_slots [num_tokens] int64 on the host (-1: no adapter) -> the step's segments;
    None when no token has an adapter."""
    adapted = torch.nonzero(token_slots >= 0).flatten()
    if len(adapted) == 0:
        return None
    slots = token_slots[adapted]
    order = torch.argsort(slots, stable=True)
    rows, slots = adapted[order], slots[order]
    unique, counts = torch.unique_consecutive(slots, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    segments = [(int(s), int(b), int(c)) for s, b, c in zip(unique.tolist(), starts.tolist(),
                                                            counts.tolist(), strict=True)]
    if len(segments) == 1 and len(rows) == len(token_slots):
        return LoRASegments(None, segments)
    return LoRASegments(rows.to(device), segments)
