"""benchmarks/memory.py's weight bytes: each weight once, whatever copies the engine keeps."""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks.memory import _kept_weight_bytes, _weight_bytes
from strand.engine_core.model_executor.layers.cpu_weights import prepare_cpu_weights
from strand.engine_core.model_executor.loader import load_model
from strand.engine_core.model_executor.model_config import load_model_config
from strand.testing.tiny_model import make_tiny_model


def test_weight_bytes_count_each_weight_once_in_its_dtype(tmp_path: Path) -> None:
    for tied in (False, True):
        for dtype in ("float32", "bfloat16"):
            model_dir = make_tiny_model(tmp_path / f"m-{tied}-{dtype}", tie_word_embeddings=tied)
            model = load_model(load_model_config(str(model_dir), dtype), torch.device("cpu"))
            loaded = _kept_weight_bytes(model)  # parameters (a tied one once) and buffers
            assert _weight_bytes(model) == loaded
            prepare_cpu_weights(model)  # panels, oneDNN's blocks beside the dense weight, ...
            assert _weight_bytes(model) == loaded, (tied, dtype)
            assert _kept_weight_bytes(model) >= loaded
