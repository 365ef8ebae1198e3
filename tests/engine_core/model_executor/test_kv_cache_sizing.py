"""How many KV blocks the runner asks for, and the cache it allocates."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from strand.engine_core.config import CacheConfig, SchedulerConfig
from strand.engine_core.model_executor.kv_cache_sizing import cuda_kv_budget
from strand.engine_core.model_executor.model_config import load_model_config
from strand.engine_core.model_executor.model_runner import ModelRunner


def _runner(model_dir: Path, dtype: str = "float32", **cache: Any) -> ModelRunner:
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
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_cache_smaller_than_max_model_len_warns_with_the_estimated_maximum(
        llama_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    runner = _runner(llama_dir, block_size=16, num_gpu_blocks_override=9)
    with caplog.at_level(logging.WARNING):
        runner.determine_num_blocks()
    # 8 usable blocks x 16 tokens = 128 tokens, half of max_model_len 256.
    assert "the KV cache holds 128 tokens, fewer than max_model_len (256)" in caplog.text
    assert "the estimated maximum model length is 128" in caplog.text


def test_kv_cache_is_one_tensor_per_layer_in_the_paged_layout(llama_dir: Path) -> None:
    runner = _runner(llama_dir, "bfloat16", block_size=8)
    runner.initialize_kv_cache(5)
    assert len(runner.kv_caches) == 2
    assert runner.kv_caches[0].shape == (2, 5, 8, 2, 16)
    assert runner.kv_caches[0].dtype == torch.bfloat16


def test_cuda_budget_subtracts_the_profile_peak_and_other_processes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gib = 2**30
    # 80 GiB device, 10 GiB free, 60 GiB reserved by torch: 10 GiB held by someone else.
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10 * gib, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 60 * gib)
    budget = cuda_kv_budget(torch.device("cuda"), 0.5, peak_torch_bytes=5 * gib)
    assert budget == 40 * gib - 5 * gib - 10 * gib


def test_profile_run_builds_a_full_budget_dummy_step(llama_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # The CUDA memory counters are stubbed: this checks the dummy batch itself runs.
    for name in ("synchronize", "reset_peak_memory_stats", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 12345)
    runner = ModelRunner(load_model_config(str(llama_dir)), CacheConfig(block_size=16),
                         SchedulerConfig(max_num_batched_tokens=100, max_num_seqs=3,
                                         max_model_len=256), device="cpu")
    seen: list[int] = []
    forward = runner.model.forward

    def counting_forward(input_ids: torch.Tensor, *args: Any) -> torch.Tensor:
        seen.append(input_ids.shape[0])
        return forward(input_ids, *args)

    runner.model.forward = counting_forward  # type: ignore[method-assign,assignment]
    assert runner.profile_peak_memory() == 12345
    assert seen == [100]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="sizes a real CUDA device's cache")
def test_cuda_cache_fills_the_utilization_left_after_the_profile_peak(
        llama_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from strand.engine_core.model_executor import kv_cache_setup, kv_cache_sizing

    # The suite caps every engine's budget (tests/conftest.py): this test sees the real one, and
    # what went into it (other processes' memory moves while parallel workers run).
    seen: dict[str, Any] = {}

    def recording_budget(device: torch.device, utilization: float, peak: int) -> int:
        free, total = torch.cuda.mem_get_info(device)
        seen.update(total=total, peak=peak, other=total - free - torch.cuda.memory_reserved(device))
        seen["budget"] = kv_cache_sizing.cuda_kv_budget(device, utilization, peak)
        return int(seen["budget"])

    monkeypatch.setattr(kv_cache_setup, "cuda_kv_budget", recording_budget)
    # A share that leaves about 2 GiB past what the card holds now (parallel workers included).
    free, total = torch.cuda.mem_get_info()
    utilization = min(1.0, (total - free + 2 * 2**30) / total)
    runner = ModelRunner(load_model_config(str(llama_dir)), CacheConfig(
        block_size=16, gpu_memory_utilization=utilization),
        SchedulerConfig(max_model_len=256, max_num_seqs=4), device="cuda")
    num_blocks = runner.determine_num_blocks()
    runner.initialize_kv_cache(num_blocks)
    weights = sum(p.numel() * p.element_size() for p in runner.model.parameters())
    assert seen["peak"] > weights  # the profile step's activations on top of the weights
    # The budget is utilization x card, less the peak and what others held (within the moment
    # between the two readings), and the cache is as many whole blocks as fit in it.
    slack = 256 * 2**20
    assert abs(seen["budget"] - (utilization * seen["total"] - seen["peak"]
                                 - max(seen["other"], 0))) < slack
    block = kv_cache_sizing.bytes_per_block(runner.kv_config, 16)
    cache_bytes = sum(c.numel() * c.element_size() for c in runner.kv_caches)
    assert cache_bytes == num_blocks * block == (seen["budget"] // block) * block
    assert runner.kv_caches[0].device.type == "cuda"
