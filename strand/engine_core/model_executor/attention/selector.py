"""Pick the attention backend for a device: flash-attn > Triton on CUDA, torch everywhere else."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable

import torch

from strand.engine_core.model_executor.attention.backend import AttentionBackend

logger = logging.getLogger(__name__)

# A factory gets the cache's block_size (flash-attn's paged path constrains it).
BackendFactory = Callable[[int], AttentionBackend]

# name -> "module:Class", imported only when chosen (Triton and flash-attn are optional).
_BACKENDS: dict[str, str] = {
    "torch": "strand.engine_core.model_executor.attention.torch_ref:TorchAttentionBackend",
    "triton": "strand.engine_core.model_executor.attention.triton_backend:TritonAttentionBackend",
    "flash_attn": "strand.engine_core.model_executor.attention.flash_attn_backend:FlashAttnBackend",
}
_NEEDS_BLOCK_SIZE = ("flash_attn",)
_AUTO_ORDER_CUDA = ("flash_attn", "triton", "torch")
_ALIASES = {"flash_attention": "flash_attn", "flashattn": "flash_attn", "torch_ref": "torch"}
_factories: dict[str, BackendFactory] = {}


def register_attention_backend(name: str, factory: BackendFactory) -> None:
    """For backends that live elsewhere: makes `name` selectable by --attention-backend."""
    _factories[name] = factory


def available_backends() -> list[str]:
    return sorted({*_BACKENDS, *_factories})


def get_attention_backend(name: str | None, device: torch.device, block_size: int,
                          converts_kv: bool = False) -> AttentionBackend:
    """`name` None: the best one that works on this device. ValueError for an unknown name.
    converts_kv: the KV cache holds another dtype than the model (kv_cache_dtype), which only
    backends with converts_kv_dtype take."""
    if name is None:
        if device.type != "cuda":
            return _create("torch", block_size, converts_kv)
        for candidate in _AUTO_ORDER_CUDA:
            try:
                return _create(candidate, block_size, converts_kv)
            except (ImportError, ValueError) as e:  # not installed, or not for this block size
                logger.info("attention backend %s not used: %s", candidate, e)
        raise AssertionError("the torch backend always works")
    key = _ALIASES.get(name.replace("-", "_"), name.replace("-", "_"))
    if key not in _BACKENDS and key not in _factories:
        raise ValueError(
            f"attention_backend must be one of {', '.join(available_backends())}, got {name!r}")
    try:
        return _create(key, block_size, converts_kv)
    except ImportError as e:
        raise ValueError(f"attention_backend {name!r} is not available: {e}") from e


def _create(name: str, block_size: int, converts_kv: bool = False) -> AttentionBackend:
    if name in _factories:
        backend = _factories[name](block_size)
    else:
        module_name, cls_name = _BACKENDS[name].split(":")
        cls = getattr(importlib.import_module(module_name), cls_name, None)
        if cls is None:
            raise ImportError(f"{module_name} has no {cls_name}")
        backend = cls(block_size) if name in _NEEDS_BLOCK_SIZE else cls()
    if not isinstance(backend, AttentionBackend):
        raise TypeError(f"attention backend {name!r} is not an AttentionBackend")
    if converts_kv and not backend.converts_kv_dtype:
        raise ValueError(f"attention backend {name!r} needs the KV cache in the model's dtype: "
                         f"use kv_cache_dtype 'auto', or attention_backend 'torch'")
    logger.info("attention backend: %s", name)
    return backend
