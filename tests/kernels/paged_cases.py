"""A paged KV cache for the CPU kernel tests: each request's blocks scattered at random, every
slot outside a request's context NaN, so a kernel reading past a context poisons its output."""

from __future__ import annotations

import torch


def scattered_paged_cache(seq_lens: list[int], num_kv_heads: int, head_dim: int,
                          block_size: int, g: torch.Generator
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv [2, num_blocks, block_size, num_kv_heads, head_dim], block_table [reqs, blocks])."""
    num_blocks = sum(-(-n // block_size) for n in seq_lens) + 3
    kv = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), float("nan"))
    perm = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    max_blocks = max(-(-n // block_size) for n in seq_lens)
    table = torch.zeros(len(seq_lens), max_blocks, dtype=torch.int32)
    for r, n in enumerate(seq_lens):
        for b in range(-(-n // block_size)):
            block = perm.pop()
            table[r, b] = block
            rows = min(block_size, n - b * block_size)
            kv[:, block, :rows] = torch.randn(2, rows, num_kv_heads, head_dim, generator=g)
    return kv, table
