"""Pure-torch KV write: scatter each token's K/V into its cache slot."""

from __future__ import annotations

import torch


def write_kv_ref(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
    slot_mapping: torch.Tensor,  # [num_tokens]; -1 = padding, not written
) -> None:
    block_size = kv_cache.shape[2]
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        block, offset = divmod(slot, block_size)
        kv_cache[0, block, offset] = key[i]
        kv_cache[1, block, offset] = value[i]
