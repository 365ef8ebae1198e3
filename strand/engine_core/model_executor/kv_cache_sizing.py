"""How many KV blocks fit: an explicit override, a byte budget on CPU, or what a CUDA device has
left after the weights and the peak activation of the largest step."""

from __future__ import annotations

import dataclasses
import logging

import torch

from strand.engine_core.model_executor.model_config import ModelConfig

logger = logging.getLogger(__name__)

MIN_NUM_BLOCKS = 2  # block 0 is reserved by the block pool: one more to hold anything


def with_cache_dtype(config: ModelConfig, cache_dtype: str) -> ModelConfig:
    """The KV cache's config: the model's (or a rank's share of it), in kv_cache_dtype's dtype
    ("auto": the model's own)."""
    if cache_dtype == "auto":
        return config
    return dataclasses.replace(config, dtype=getattr(torch, cache_dtype))


def bytes_per_block(config: ModelConfig, block_size: int) -> int:
    """K and V of every layer for block_size tokens."""
    element = torch.empty(0, dtype=config.dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * element


def num_blocks_for_budget(budget_bytes: int, config: ModelConfig, block_size: int,
                          what: str) -> int:
    num_blocks = int(budget_bytes // bytes_per_block(config, block_size))
    if num_blocks < MIN_NUM_BLOCKS:
        raise ValueError(
            f"{what} leaves room for {num_blocks} KV cache block(s) of {block_size} tokens "
            f"({bytes_per_block(config, block_size)} bytes each); at least {MIN_NUM_BLOCKS} are "
            f"needed: raise it or lower max_num_batched_tokens / the model size")
    return num_blocks


def cuda_kv_budget(device: torch.device, gpu_memory_utilization: float,
                   peak_torch_bytes: int) -> int:
    """Bytes left for the cache: utilization x total, minus the torch peak of the profile run and
    what other processes / non-torch allocations already hold on the device."""
    free, total = torch.cuda.mem_get_info(device)
    non_torch = total - free - torch.cuda.memory_reserved(device)
    budget = int(total * gpu_memory_utilization) - peak_torch_bytes - max(non_torch, 0)
    logger.info("CUDA memory: total %.2f GiB, torch peak %.2f GiB, other %.2f GiB, "
                "KV budget %.2f GiB", total / 2**30, peak_torch_bytes / 2**30,
                max(non_torch, 0) / 2**30, budget / 2**30)
    return budget


def log_capacity(num_blocks: int, block_size: int, max_model_len: int) -> None:
    # Block 0 is reserved, hence num_blocks - 1 usable.
    tokens = (num_blocks - 1) * block_size
    logger.info("KV cache: %d blocks of %d tokens (%d tokens); maximum concurrency at "
                "max_model_len %d: %.2fx", num_blocks, block_size, tokens, max_model_len,
                tokens / max_model_len)
    if tokens < max_model_len:
        # vLLM refuses to start here; this engine starts and refuses, by name, each request
        # that could never fit. Said once now, so the first such refusal is no surprise.
        logger.warning("the KV cache holds %d tokens, fewer than max_model_len (%d): a request "
                       "whose prompt + max_tokens needs more is refused; the estimated maximum "
                       "model length is %d (raise the KV cache budget or lower max_model_len)",
                       tokens, max_model_len, tokens)
