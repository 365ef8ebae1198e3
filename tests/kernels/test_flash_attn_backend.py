"""FlashAttnBackend: its page-size rule everywhere; its numbers only where flash-attn runs."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from strand.engine_core.model_executor.attention.flash_attn_backend import FlashAttnBackend
from tests.kernels.conftest import assert_close, dense_causal_attention, make_paged_batch

needs_flash_attn = pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("flash_attn") is None,
    reason="flash-attn is not installed or there is no CUDA device (it needs both)")


@pytest.mark.parametrize("block_size", [16, 128, 300])
def test_block_size_not_a_multiple_of_256_is_rejected(block_size: int) -> None:
    with pytest.raises(ValueError, match=f"block_size must be a multiple of 256.*got {block_size}"):
        FlashAttnBackend(block_size)


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None,
                    reason="flash-attn is installed here")
def test_missing_flash_attn_raises_import_error_naming_the_package() -> None:
    with pytest.raises(ImportError, match="flash-attn"):
        FlashAttnBackend(256)


@needs_flash_attn
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("query_lens", "context_lens"),
    [([1, 1, 1], [300, 5, 600]), ([40, 1, 7], [260, 100, 0])],
    ids=["decodes", "mixed"],
)
def test_forward_matches_dense_causal_attention(
    query_lens: list[int], context_lens: list[int], dtype: torch.dtype
) -> None:
    batch = make_paged_batch(query_lens, context_lens, num_heads=8, num_kv_heads=2,
                             head_dim=64, block_size=256, dtype=dtype, write_new_tokens=False)
    out = FlashAttnBackend(256).forward(
        batch.query, batch.new_keys, batch.new_values, batch.kv_cache, batch.metadata(), 0.125)
    assert_close(out, dense_causal_attention(batch, 0.125), dtype)
