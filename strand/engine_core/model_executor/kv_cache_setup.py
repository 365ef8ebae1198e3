"""The runner's KV cache: how many blocks fit (an override, the CPU byte budget, or what a CUDA
device has left after a profile step of the largest batch), the paged tensors, and the decode
graphs that hold those tensors' addresses."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from strand.engine_core.config import CacheConfig, SchedulerConfig
from strand.engine_core.model_executor.attention.backend import AttentionBackend
from strand.engine_core.model_executor.attention.metadata_builder import build_attention_metadata
from strand.engine_core.model_executor.cuda_graphs import GraphCapturer, choose_capturer
from strand.engine_core.model_executor.decode_graphs import DecodeGraphRunner
from strand.engine_core.model_executor.kv_cache_sizing import (
    bytes_per_block,
    cuda_kv_budget,
    log_capacity,
    num_blocks_for_budget,
)
from strand.engine_core.model_executor.model_config import ModelConfig

logger = logging.getLogger(__name__)


class KVCacheSetup:
    """ModelRunner's KV cache methods; the attributes are the runner's (set in its __init__)."""

    cache_config: CacheConfig
    scheduler_config: SchedulerConfig
    kv_config: ModelConfig  # this rank's share of the KV heads under tensor parallelism
    block_size: int
    device: torch.device
    model: Any
    attn_backend: AttentionBackend
    enforce_eager: bool
    _graph_capturer: GraphCapturer | None
    decode_graphs: DecodeGraphRunner | None
    kv_caches: list[torch.Tensor]

    def determine_num_blocks(self) -> int:
        """Override, else the CPU byte budget, else what CUDA has left after a profile run."""
        override = self.cache_config.num_gpu_blocks_override
        if override is not None:
            if override < 2:
                raise ValueError(f"num_gpu_blocks_override must be >= 2, got {override}")
            num_blocks = override
        elif self.device.type == "cuda":
            peak = self.profile_peak_memory()
            budget = cuda_kv_budget(self.device, self.cache_config.gpu_memory_utilization, peak)
            num_blocks = num_blocks_for_budget(budget, self.kv_config, self.block_size,
                                               "gpu_memory_utilization")
        else:
            num_blocks = num_blocks_for_budget(self.cache_config.kv_cache_memory,
                                               self.kv_config, self.block_size,
                                               "kv_cache_memory")
        log_capacity(num_blocks, self.block_size, self.scheduler_config.max_model_len)
        return num_blocks

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.kv_caches = self._allocate_kv_caches(num_blocks)
        logger.info("allocated %.1f MiB of KV cache",
                    num_blocks * bytes_per_block(self.kv_config, self.block_size) / 2**20)
        # Graphs hold the cache tensors' addresses: a new cache needs new graphs.
        self.decode_graphs = None
        capturer = choose_capturer(self.device, self.enforce_eager, self.attn_backend,
                                   self._graph_capturer)
        if capturer is not None:
            graphs = DecodeGraphRunner(
                self.model, self.attn_backend, self.kv_caches, capturer,
                max_num_seqs=self.scheduler_config.max_num_seqs,
                max_model_len=self.scheduler_config.max_model_len,
                block_size=self.block_size, device=self.device)
            graphs.capture()
            self.decode_graphs = graphs

    def _allocate_kv_caches(self, num_blocks: int) -> list[torch.Tensor]:
        c = self.kv_config
        shape = (2, num_blocks, self.block_size, c.num_kv_heads, c.head_dim)
        return [torch.zeros(shape, dtype=c.dtype, device=self.device)
                for _ in range(c.num_layers)]

    @torch.inference_mode()
    def profile_peak_memory(self) -> int:
        """Peak torch bytes (weights included) of a dummy step of max_num_batched_tokens tokens
        over max_num_seqs requests, with the logits and sampler work it implies."""
        cfg = self.scheduler_config
        num_tokens = min(cfg.max_num_batched_tokens, cfg.max_num_seqs * cfg.max_model_len)
        num_reqs = max(1, min(cfg.max_num_seqs, num_tokens))
        query_lens = np.full(num_reqs, num_tokens // num_reqs, dtype=np.int64)
        query_lens[: num_tokens % num_reqs] += 1
        blocks_per_req = -(-int(query_lens.max()) // self.block_size)
        # Block 0 left unused, as in the real pool; one temporary cache just large enough.
        caches = self._allocate_kv_caches(1 + num_reqs * blocks_per_req)
        table = 1 + np.arange(num_reqs * blocks_per_req, dtype=np.int32).reshape(num_reqs, -1)
        req_of_token = np.repeat(np.arange(num_reqs), query_lens)
        starts = np.cumsum(query_lens) - query_lens
        positions = np.arange(num_tokens) - starts[req_of_token]
        slots = table[req_of_token, positions // self.block_size] * self.block_size + (
            positions % self.block_size)
        metadata = build_attention_metadata(query_lens, query_lens, slots, table,
                                            self.block_size, self.device)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        ids = torch.zeros(num_tokens, dtype=torch.int64, device=self.device)
        pos = torch.from_numpy(positions).to(self.device)
        hidden = self.model(ids, pos, caches, metadata, self.attn_backend)
        logits = self.model.compute_logits(hidden[torch.from_numpy(np.cumsum(query_lens) - 1)
                                                  .to(self.device)])
        torch.log_softmax(logits.float(), dim=-1)  # the sampler's float32 copies
        torch.cuda.synchronize(self.device)
        peak = int(torch.cuda.max_memory_allocated(self.device))
        del caches, hidden, logits
        torch.cuda.empty_cache()
        return peak
