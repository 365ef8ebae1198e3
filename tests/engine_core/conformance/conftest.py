"""Builders for the vLLM conformance suite: a tiny engine, a bare scheduler, a tokenizer.

Each test module mirrors one vLLM test module; each test is named after the vLLM case whose
behaviour it checks, written against Strand's own API.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from strand.engine_core import EngineArgs, LLMEngine, RequestOutput
from strand.engine_core.config import CacheConfig, SchedulerConfig
from strand.engine_core.core.request import Request
from strand.engine_core.core.scheduler import Scheduler
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.sampling_params import SamplingParams
from strand.testing.tiny_tokenizer import write_tiny_tokenizer

TINY_VOCAB_SIZE = 400


def make_engine(model_dir: Path, **overrides: Any) -> LLMEngine:
    args: dict[str, Any] = {"model": str(model_dir), "dtype": "float32", "device": "cpu",
                            "num_gpu_blocks_override": 64, "max_model_len": 256}
    args.update(overrides)
    return LLMEngine.from_engine_args(EngineArgs(**args))


def run_to_completion(engine: LLMEngine, max_steps: int = 2_000) -> dict[str, RequestOutput]:
    finished: dict[str, RequestOutput] = {}
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            return finished
        for out in engine.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            if out.finished:
                finished[out.request_id] = out
    raise AssertionError(f"engine still busy after {max_steps} steps")


def make_scheduler(num_blocks: int = 64, block_size: int = 4, max_num_seqs: int = 16,
                   max_num_batched_tokens: int = 64, enable_prefix_caching: bool = True,
                   max_model_len: int = 256, connector: object | None = None,
                   policy: str = "fcfs") -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_batched_tokens=max_num_batched_tokens,
                        max_num_seqs=max_num_seqs, max_model_len=max_model_len, policy=policy),
        CacheConfig(block_size=block_size, enable_prefix_caching=enable_prefix_caching),
        num_blocks, connector=connector)


def make_request(request_id: str, prompt_token_ids: list[int], max_tokens: int = 16,
                 **params: Any) -> Request:
    return Request(request_id=request_id, prompt_token_ids=list(prompt_token_ids),
                   sampling_params=SamplingParams(max_tokens=max_tokens, **params),
                   eos_token_id=None)


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    path = tmp_path_factory.mktemp("conformance-tokenizer")
    write_tiny_tokenizer(path, TINY_VOCAB_SIZE, seed=0)
    return Tokenizer.from_dir(str(path))


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> LLMEngine:
    """One engine per module: building it costs more than most tests."""
    return make_engine(tiny_model_dir)
