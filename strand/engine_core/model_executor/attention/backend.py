"""The attention backend interface: one flattened batch of prefill chunks and decodes.

The KV cache of one layer is a tensor [2, num_blocks, block_size, num_kv_heads, head_dim]
(index 0 = keys, 1 = values); the layout flash-attn's paged kvcache expects for each half.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionMetadata:
    num_reqs: int
    num_actual_tokens: int  # tokens of this step (rows of q before any padding)
    # [num_tokens] int64: flat cache slot (block_id * block_size + offset) of each new token.
    slot_mapping: torch.Tensor
    # [num_reqs + 1] int32: row where each request's new tokens start in q; last = num_tokens.
    query_start_loc: torch.Tensor
    # [num_reqs] int32: context length after this step (cached + new tokens).
    seq_lens: torch.Tensor
    # [num_reqs, max_num_blocks] int32: block ids of each request, padded with 0.
    block_table: torch.Tensor
    max_query_len: int
    max_seq_len: int
    # Host copies, so backends need no device->host sync to plan their work.
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor
    block_size: int

    @property
    def is_all_decode(self) -> bool:
        return self.max_query_len == 1


class AttentionBackend(ABC):
    """Writes this step's K/V into the paged cache, then attends causally over the context."""

    name: str = "abstract"
    # True when forward, on a batch of one-token requests, reads only the metadata's device
    # tensors and ints that a graph fixes at capture (no host copies, no shapes taken from the
    # data, no host sync), and skips slot -1 in the KV write: one CUDA graph per batch size then
    # replays it for any contents (model_executor/decode_graphs.py).
    supports_cuda_graphs: bool = False
    # True when the cache may hold another dtype than the query (kv_cache_dtype="bfloat16" under
    # float32 weights): the K/V are rounded to the cache's dtype as they are written and every
    # token's attention reads them from there, so a prefix-cache hit reads what a miss did.
    converts_kv_dtype: bool = False

    @abstractmethod
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
        """sliding_window: a query at position p sees keys at positions > p - sliding_window
        (HF's and Gemma's convention: the window counts the query itself); None = full context.
        logit_softcap: scores become cap * tanh(scores / cap) before the softmax (Gemma 2).

        Every block of a windowed layer stays allocated and keys older than the window are
        masked here: prefix caching and the block pool need no change. vLLM's hybrid KV cache
        manager frees out-of-window blocks instead, the reference for a later memory saving."""
        ...
