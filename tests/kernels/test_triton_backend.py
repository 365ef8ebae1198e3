"""TritonAttentionBackend.forward: writes this step's K/V, then matches dense causal attention."""

from __future__ import annotations

import pytest
import torch

from strand.engine_core.model_executor.attention.triton_backend import TritonAttentionBackend
from strand.kernels.paged_attention_ref import paged_attention_ref
from tests.kernels.conftest import (
    DEVICE,
    DTYPES,
    assert_close,
    dense_causal_attention,
    make_paged_batch,
)

BATCHES = {
    "decodes": ([1, 1], [12, 40]),
    "prefills": ([10, 3], [0, 0]),
    "mixed_with_cached_prefix": ([9, 1, 17], [16, 30, 0]),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("case", list(BATCHES))
def test_forward_matches_dense_causal_attention(
    case: str, block_size: int, dtype: torch.dtype
) -> None:
    batch = make_paged_batch(*BATCHES[case], num_heads=8, num_kv_heads=2, block_size=block_size,
                             dtype=dtype, seed=block_size, write_new_tokens=False)
    out = TritonAttentionBackend().forward(
        batch.query, batch.new_keys, batch.new_values, batch.kv_cache, batch.metadata(), 0.2)
    assert out.shape == batch.query.shape and out.dtype == dtype
    assert_close(out, dense_causal_attention(batch, 0.2), dtype)


def test_a_bfloat16_cache_under_float32_is_written_rounded_and_read_widened() -> None:
    # kv_cache_dtype="bfloat16" with float32 weights: the new K/V go in rounded, and the
    # attention is the float32 one over the cache's values.
    batch = make_paged_batch(*BATCHES["mixed_with_cached_prefix"], num_heads=8, num_kv_heads=2,
                             dtype=torch.float32, seed=3, write_new_tokens=False)
    cache = batch.kv_cache.to(torch.bfloat16)
    backend = TritonAttentionBackend()
    assert backend.converts_kv_dtype
    out = backend.forward(batch.query, batch.new_keys, batch.new_values, cache,
                          batch.metadata(), 0.2)
    flat = cache.flatten(1, 2)
    for half, new in ((0, batch.new_keys), (1, batch.new_values)):
        written, want = flat[half, batch.slot_mapping], new.bfloat16()
        if DEVICE.type == "cuda":
            assert torch.equal(written, want)
        else:  # Triton's interpreter truncates, whatever fp_downcast_rounding asks: one unit
            torch.testing.assert_close(written.float(), want.float(), rtol=2**-7, atol=0)
    ref = paged_attention_ref(batch.query, torch.nan_to_num(cache.float(), nan=0.0),
                              batch.query_start_loc, batch.seq_lens, batch.block_table, 0.2)
    assert out.dtype == torch.float32
    assert_close(out, ref, torch.float32)


def test_forward_writes_the_new_tokens_into_their_slots() -> None:
    batch = make_paged_batch([3, 1], [5, 20], write_new_tokens=False, seed=1)
    TritonAttentionBackend().forward(
        batch.query, batch.new_keys, batch.new_values, batch.kv_cache, batch.metadata(), 0.2)
    flat = batch.kv_cache.flatten(1, 2)  # [2, num_slots, num_kv_heads, head_dim]
    assert torch.equal(flat[0, batch.slot_mapping], batch.new_keys)
    assert torch.equal(flat[1, batch.slot_mapping], batch.new_values)


def test_padding_rows_come_back_zero_and_touch_no_cache_slot() -> None:
    batch = make_paged_batch([2, 1], [6, 9], seed=2)
    num_real = batch.query.shape[0]
    pad = torch.randn(3, *batch.query.shape[1:], device=DEVICE)
    kv_pad = torch.randn(3, *batch.new_keys.shape[1:], device=DEVICE)
    cache_before = batch.kv_cache.clone()
    out = TritonAttentionBackend().forward(
        torch.cat([batch.query, pad]), torch.cat([batch.new_keys, kv_pad]),
        torch.cat([batch.new_values, kv_pad]), batch.kv_cache, batch.metadata(3), 0.2)
    assert torch.equal(out[num_real:], torch.zeros_like(out[num_real:]))
    assert_close(out[:num_real], dense_causal_attention(batch, 0.2), torch.float32)
    assert torch.equal(batch.kv_cache.nan_to_num(), cache_before.nan_to_num())


def test_forced_split_kv_matches_dense_causal_attention() -> None:
    batch = make_paged_batch([1, 4], [120, 70], write_new_tokens=False, seed=3)
    out = TritonAttentionBackend(num_splits=4).forward(
        batch.query, batch.new_keys, batch.new_values, batch.kv_cache, batch.metadata(), 0.2)
    assert_close(out, dense_causal_attention(batch, 0.2), torch.float32)


def test_cache_block_size_must_match_metadata() -> None:
    batch = make_paged_batch([2], [0], block_size=16)
    metadata = batch.metadata()
    metadata.block_size = 32
    with pytest.raises(ValueError, match="block_size"):
        TritonAttentionBackend().forward(
            batch.query, batch.new_keys, batch.new_values, batch.kv_cache, metadata, 0.2)


def test_num_splits_below_one_is_rejected() -> None:
    with pytest.raises(ValueError, match="num_splits must be >= 1"):
        TritonAttentionBackend(num_splits=0)
