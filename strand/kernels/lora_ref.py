"""Pure-torch batched LoRA, per token (punica's bgmv): each row gathers its own adapter's A and
B. The reference for strand/kernels/lora.py and for the segmented torch path (strand/engine_core/lora/punica.py).
"""

from __future__ import annotations

import torch


def add_lora_ref(
    out: torch.Tensor,  # [num_tokens, out_features], updated in place
    x: torch.Tensor,  # [num_tokens, in_features]
    lora_a: torch.Tensor,  # [num_slots, width, in_features]
    lora_b: torch.Tensor,  # [num_slots, out_features, width] (scaling folded in)
    token_slots: torch.Tensor,  # [num_tokens] int64; -1: the base model (row untouched)
) -> torch.Tensor:
    """out[t] += B[slot] @ (A[slot] @ x[t]), sums in float32, for every t with slot >= 0."""
    adapted = token_slots >= 0
    slots = token_slots[adapted]
    shrunk = torch.einsum("ti,twi->tw", x[adapted].float(), lora_a[slots].float())
    delta = torch.einsum("tw,tow->to", shrunk, lora_b[slots].float())
    out[adapted] = (out[adapted].float() + delta).to(out.dtype)
    return out
