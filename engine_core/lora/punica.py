"""Batched LoRA over a mixed batch (punica's shrink/expand), in torch.

Every token of a step carries an adapter slot (or none). Tokens are grouped by slot once per
step (LoRAGroups); each adapted Linear then adds, per group, (x @ A[slot]^T) @ B[slot]^T to its
output: two small products per adapter in the batch, none for base-model tokens, whose rows are
never touched. On CUDA the layers take kernels/lora.py (Triton, per token) instead;
kernels/lora_ref.py is the reference both are tested against.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class LoRAGroup:
    slot: int  # index into the stacked A / B of every adapted layer
    rows: torch.Tensor | None  # [k] int64 token rows using the slot; None: every row


def add_lora(
    out: torch.Tensor,  # [num_tokens, out_features], updated in place
    x: torch.Tensor,  # [num_tokens, in_features]
    lora_a: torch.Tensor,  # [num_slots, rank, in_features]
    lora_b: torch.Tensor,  # [num_slots, out_features, rank] (scaling folded in)
    groups: list[LoRAGroup],
) -> torch.Tensor:
    for group in groups:
        a, b = lora_a[group.slot], lora_b[group.slot]
        if group.rows is None:  # the whole batch on one adapter: no gather, no scatter
            out.addmm_(x @ a.t(), b.t())
        else:
            shrunk = x.index_select(0, group.rows) @ a.t()  # [k, rank]
            out.index_add_(0, group.rows, shrunk @ b.t())
    return out


def make_groups(token_slots: torch.Tensor, device: torch.device) -> list[LoRAGroup]:
    """token_slots [num_tokens] int64 on the host (-1: no adapter) -> one group per slot, its
    rows on `device`."""
    groups = []
    for slot in torch.unique(token_slots).tolist():
        if slot < 0:
            continue
        rows = torch.nonzero(token_slots == slot).flatten()
        whole = len(rows) == len(token_slots)
        groups.append(LoRAGroup(int(slot), None if whole else rows.to(device)))
    return groups
