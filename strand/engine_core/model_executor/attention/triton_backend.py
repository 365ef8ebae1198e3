"""Attention backend on Triton kernels: KV write by slot mapping, then paged attention."""

from __future__ import annotations

import torch

from strand.engine_core.model_executor.attention.backend import AttentionBackend, AttentionMetadata
from strand.kernels._triton import triton_usable
from strand.kernels.kv_write import write_kv
from strand.kernels.paged_attention import paged_attention


class TritonAttentionBackend(AttentionBackend):
    """Runs on CUDA, or on CPU under TRITON_INTERPRET=1 (tests only: slow).

    num_splits: None lets paged_attention choose split-KV per batch from max_seq_len. A CUDA
    graph replays whatever was chosen at capture: the decode graphs are captured with
    max_seq_len = max_model_len, so the choice covers every context the graph will see (splits
    past a short context stay empty and weigh 0 in the reduce).
    """

    name = "triton"
    supports_cuda_graphs = True
    # A bfloat16 cache under float32 weights: the KV write rounds, the kernel widens as it loads.
    converts_kv_dtype = True

    def __init__(self, num_splits: int | None = None) -> None:
        if not triton_usable():
            raise ImportError(
                "the triton backend needs the triton package and a CUDA device "
                "(or TRITON_INTERPRET=1 to run it on CPU)")
        if num_splits is not None and num_splits < 1:
            raise ValueError(f"num_splits must be >= 1, got {num_splits}")
        self.num_splits = num_splits

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
        if kv_cache.shape[2] != metadata.block_size:
            raise ValueError(
                f"kv_cache block_size ({kv_cache.shape[2]}) must equal metadata.block_size "
                f"({metadata.block_size})")
        write_kv(key, value, kv_cache, metadata.slot_mapping)
        out = torch.empty_like(query)
        paged_attention(
            query, kv_cache, out,
            query_start_loc=metadata.query_start_loc,
            seq_lens=metadata.seq_lens,
            block_table=metadata.block_table,
            scale=scale,
            max_query_len=metadata.max_query_len,
            max_seq_len=metadata.max_seq_len,
            num_splits=self.num_splits,
            sliding_window=sliding_window,
            softcap=logit_softcap,
        )
        if query.shape[0] > metadata.num_actual_tokens:
            # Padding rows (CUDA-graph batches) are not attended; zero them, not garbage.
            out[metadata.num_actual_tokens:].zero_()
        return out
