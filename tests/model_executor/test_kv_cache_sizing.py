"""How many KV blocks the runner asks for, and the cache it allocates."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from engine_core.config import CacheConfig, SchedulerConfig
from engine_core.model_executor.model_config import load_model_config
from engine_core.model_executor.model_runner import ModelRunner


def _runner(model_dir: Path, dtype: str = "float32", **cache: object) -> ModelRunner:
    return ModelRunner(load_model_config(str(model_dir), dtype), CacheConfig(**cache),
                       SchedulerConfig(max_model_len=256, max_num_seqs=4), device="cpu")


def test_override_wins(llama_dir: Path) -> None:
    assert _runner(llama_dir, num_gpu_blocks_override=37).determine_num_blocks() == 37


def test_cpu_budget_divided_by_the_bytes_of_one_block(llama_dir: Path) -> None:
    # 2 (K,V) x 2 layers x 16 tokens x 2 kv heads x 16 dims x 4 bytes = 8 KiB a block.
    runner = _runner(llama_dir, block_size=16, kv_cache_memory=1024 * 1024)
    assert runner.determine_num_blocks() == 128


def test_bfloat16_halves_the_block_size_in_bytes(llama_dir: Path) -> None:
    runner = _runner(llama_dir, "bfloat16", block_size=16, kv_cache_memory=1024 * 1024)
    assert runner.determine_num_blocks() == 256


def test_budget_too_small_for_two_blocks_names_the_setting(llama_dir: Path) -> None:
    with pytest.raises(ValueError, match="kv_cache_memory leaves room for 1 KV cache block"):
        _runner(llama_dir, block_size=16, kv_cache_memory=9000).determine_num_blocks()


def test_logs_block_count_and_max_concurrency(llama_dir: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    runner = _runner(llama_dir, block_size=16, num_gpu_blocks_override=33)
    with caplog.at_level(logging.INFO):
        runner.determine_num_blocks()
    # 32 usable blocks x 16 tokens = 512 tokens = 2 requests of max_model_len 256.
    assert "33 blocks of 16 tokens" in caplog.text
    assert "max_model_len 256: 2.00x" in caplog.text


def test_kv_cache_is_one_tensor_per_layer_in_the_paged_layout(llama_dir: Path) -> None:
    runner = _runner(llama_dir, "bfloat16", block_size=8)
    runner.initialize_kv_cache(5)
    assert len(runner.kv_caches) == 2
    assert runner.kv_caches[0].shape == (2, 5, 8, 2, 16)
    assert runner.kv_caches[0].dtype == torch.bfloat16
