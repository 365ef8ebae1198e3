"""Attention backend on flash-attn 2's paged KV: varlen for mixed batches, kvcache for decode.

flash-attn reads each half of our cache, [num_blocks, block_size, num_kv_heads, head_dim], as
its paged k_cache / v_cache directly; its paged path needs block_size % 256 == 0.
The new K/V are written by the Triton slot-mapping kernel first (flash-attn's own append only
handles one contiguous run per sequence, not a mixed batch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from strand.engine_core.model_executor.attention.backend import AttentionBackend, AttentionMetadata
from strand.kernels.kv_write import write_kv

FLASH_ATTN_PAGE_MULTIPLE = 256


class FlashAttnBackend(AttentionBackend):
    name = "flash_attn"
    # Decodes take the flash_attn_with_kvcache path: shapes from the batch size, lengths and
    # block table read on the device.
    supports_cuda_graphs = True

    def __init__(self, block_size: int) -> None:
        if block_size <= 0 or block_size % FLASH_ATTN_PAGE_MULTIPLE != 0:
            raise ValueError(
                f"block_size must be a multiple of {FLASH_ATTN_PAGE_MULTIPLE} for flash-attn's "
                f"paged KV cache, got {block_size}; use --block-size 256 or another backend")
        try:
            from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache
        except ImportError as e:
            raise ImportError(
                "the flash_attn backend needs the flash-attn package (pip install flash-attn) "
                "on a CUDA device") from e
        self.block_size = block_size
        self._varlen: Callable[..., Any] = flash_attn_varlen_func
        self._with_kvcache: Callable[..., Any] = flash_attn_with_kvcache

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [2, num_blocks, block_size, num_kv_heads, head_dim]
        metadata: AttentionMetadata,
        scale: float,
        sliding_window: int | None = None,
        logit_softcap: float | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        if query.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"flash-attn needs float16 or bfloat16, got dtype {query.dtype}")
        if kv_cache.shape[2] != self.block_size:
            raise ValueError(
                f"kv_cache block_size ({kv_cache.shape[2]}) must equal the backend's "
                f"block_size ({self.block_size})")
        write_kv(key, value, kv_cache, metadata.slot_mapping)
        # flash-attn's window counts the keys left of the query (ours includes the query);
        # (-1, -1) and softcap 0.0 are its "off". Not run in this repository's CI (no GPU).
        extra = {"window_size": (-1, -1) if sliding_window is None else (sliding_window - 1, 0),
                 "softcap": logit_softcap or 0.0}
        num_reqs = metadata.num_reqs
        key_cache, value_cache = kv_cache[0], kv_cache[1]
        block_table = metadata.block_table[:num_reqs]
        if metadata.is_all_decode:
            # One query row per request, rows 0..num_reqs-1: a [batch, 1] decode call.
            decoded = self._with_kvcache(
                query[:num_reqs].unsqueeze(1), key_cache, value_cache,
                cache_seqlens=metadata.seq_lens[:num_reqs], block_table=block_table,
                softmax_scale=scale, causal=True, **extra,
            )  # [num_reqs, 1, num_heads, head_dim]
            out = torch.empty_like(query)
            out[:num_reqs] = decoded.squeeze(1)
            out[num_reqs:].zero_()
            return out
        cu_seqlens_k = torch.zeros(num_reqs + 1, dtype=torch.int32, device=query.device)
        cu_seqlens_k[1:] = torch.cumsum(metadata.seq_lens[:num_reqs], dim=0)
        # causal=True aligns the mask bottom-right: a chunk's rows sit at the end of its context.
        out = self._varlen(
            query, key_cache, value_cache,
            cu_seqlens_q=metadata.query_start_loc, cu_seqlens_k=cu_seqlens_k,
            max_seqlen_q=metadata.max_query_len, max_seqlen_k=metadata.max_seq_len,
            softmax_scale=scale, causal=True, block_table=block_table, **extra,
        )  # [num_tokens, num_heads, head_dim]
        if query.shape[0] > metadata.num_actual_tokens:
            out[metadata.num_actual_tokens:].zero_()
        return out
