"""Triton paged attention against the pure-torch reference, on fresh random batches."""

from __future__ import annotations

import pytest
import torch

from strand.kernels.paged_attention import choose_num_splits, paged_attention
from strand.kernels.paged_attention_ref import paged_attention_ref
from tests.kernels.conftest import (
    DEVICE,
    DTYPES,
    PagedBatch,
    assert_close,
    dense_causal_attention,
    make_paged_batch,
    poisoned_like,
)

# (query_lens, context_lens): what each request brings this step and what it has cached.
BATCHES = {
    "decodes": ([1, 1, 1], [4, 33, 70]),
    "fresh_prefills": ([7, 19], [0, 0]),
    "chunks_on_cached_prefixes": ([9, 24], [16, 37]),
    "mixed_chunks_and_decodes": ([9, 1, 24, 1], [16, 40, 7, 0]),
}
# (num_heads, num_kv_heads, head_dim, block_size)
LAYOUTS = [
    (4, 4, 32, 16),  # MHA
    (4, 2, 64, 32),  # GQA 2
    (8, 2, 32, 32),  # GQA 4
    (4, 1, 64, 16),  # MQA-like GQA 4
]


def run_kernel(batch: PagedBatch, scale: float, **kwargs: int) -> torch.Tensor:
    out = poisoned_like(batch.query)
    paged_attention(
        batch.query, batch.kv_cache, out, batch.query_start_loc, batch.seq_lens,
        batch.block_table, scale, batch.max_query_len, batch.max_seq_len, **kwargs)
    return out


def run_reference(batch: PagedBatch, scale: float) -> torch.Tensor:
    return paged_attention_ref(
        batch.query, batch.kv_cache, batch.query_start_loc, batch.seq_lens,
        batch.block_table, scale)


def test_reference_matches_dense_causal_attention() -> None:
    batch = make_paged_batch(*BATCHES["mixed_chunks_and_decodes"], num_heads=8, num_kv_heads=2)
    expected = dense_causal_attention(batch, scale=0.2)
    torch.testing.assert_close(run_reference(batch, 0.2), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda s: "h{}_kv{}_d{}_bs{}".format(*s))
@pytest.mark.parametrize("case", list(BATCHES), ids=str)
def test_kernel_matches_reference(
    case: str, layout: tuple[int, int, int, int], dtype: torch.dtype
) -> None:
    num_heads, num_kv_heads, head_dim, block_size = layout
    query_lens, context_lens = BATCHES[case]
    batch = make_paged_batch(
        query_lens, context_lens, num_heads, num_kv_heads, head_dim, block_size, dtype,
        seed=hash((case, layout)) % 1000)
    scale = head_dim**-0.5
    assert_close(run_kernel(batch, scale, num_splits=1), run_reference(batch, scale), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("num_splits", [2, 3, 4])
def test_split_kv_matches_reference(num_splits: int, dtype: torch.dtype) -> None:
    # Long contexts at small batch, plus one short context that leaves some splits empty.
    batch = make_paged_batch(
        [1, 1, 3], [150, 9, 90], num_heads=8, num_kv_heads=2, dtype=dtype, seed=num_splits)
    scale = 0.125
    out = run_kernel(batch, scale, num_splits=num_splits, tile_n=16)
    assert_close(out, run_reference(batch, scale), dtype)


def test_split_kv_handles_prefill_chunks() -> None:
    batch = make_paged_batch([20, 1], [45, 60], num_heads=4, num_kv_heads=4, seed=7)
    out = run_kernel(batch, 0.2, num_splits=4, tile_n=16)
    assert_close(out, run_reference(batch, 0.2), torch.float32)


@pytest.mark.parametrize("tile_n", [16, 32, 64])
def test_block_size_not_a_power_of_two_matches_reference(tile_n: int) -> None:
    batch = make_paged_batch([5, 1, 30], [50, 95, 20], block_size=48, seed=tile_n)
    assert_close(run_kernel(batch, 0.3, tile_n=tile_n), run_reference(batch, 0.3), torch.float32)


def test_head_dim_not_a_power_of_two_matches_reference() -> None:
    batch = make_paged_batch([6, 1], [10, 20], head_dim=40, seed=3)
    assert_close(run_kernel(batch, 0.15), run_reference(batch, 0.15), torch.float32)


def test_gqa_group_not_a_power_of_two_matches_reference() -> None:
    batch = make_paged_batch([7, 1], [12, 30], num_heads=6, num_kv_heads=2, seed=4)
    assert_close(run_kernel(batch, 0.2), run_reference(batch, 0.2), torch.float32)


def test_strided_query_view_matches_reference() -> None:
    batch = make_paged_batch([6, 1], [10, 20], num_heads=4, num_kv_heads=2, seed=5)
    # A query sliced out of a fused qkv projection: rows are not contiguous.
    fused = torch.randn(batch.query.shape[0], 8, 32, device=DEVICE)
    fused[:, :4] = batch.query
    batch.query = fused[:, :4]
    assert_close(run_kernel(batch, 0.2), run_reference(batch, 0.2), torch.float32)


def test_padding_rows_past_the_last_request_are_not_written() -> None:
    batch = make_paged_batch([3, 1], [5, 9], seed=6)
    num_real = batch.query.shape[0]
    batch.query = torch.cat([batch.query, torch.randn(4, *batch.query.shape[1:], device=DEVICE)])
    for num_splits in (1, 2):
        out = run_kernel(batch, 0.2, num_splits=num_splits)
        assert out[num_real:].isnan().all()
        assert not out[:num_real].isnan().any()


def test_zero_query_len_request_is_skipped() -> None:
    batch = make_paged_batch([4, 1], [3, 8], seed=8)
    # A third request with nothing to compute this step (e.g. a padded batch slot).
    batch.query_start_loc = torch.cat([batch.query_start_loc, batch.query_start_loc[-1:]])
    batch.seq_lens = torch.cat([batch.seq_lens, batch.seq_lens[:1]])
    batch.block_table = torch.cat([batch.block_table, batch.block_table[:1]])
    batch.query_lens.append(0)
    assert_close(run_kernel(batch, 0.2), run_reference(batch, 0.2), torch.float32)


def test_heuristic_splits_long_context_at_small_batch() -> None:
    splits = choose_num_splits(
        num_reqs=1, num_kv_heads=2, num_q_blocks_per_req=1, max_seq_len=4096, tile_n=64,
        device=torch.device("cpu"))
    assert splits == 8


def test_heuristic_keeps_one_pass_for_large_batches_and_short_contexts() -> None:
    cpu = torch.device("cpu")
    assert choose_num_splits(64, 8, 1, 4096, 64, cpu) == 1
    assert choose_num_splits(1, 2, 1, 256, 64, cpu) == 1


def test_heuristic_choice_matches_reference() -> None:
    # One request, one kv head, 1100 positions: the heuristic picks 2 splits here.
    assert choose_num_splits(1, 1, 1, 1101, 64, DEVICE) == 2
    batch = make_paged_batch([1], [1100], num_heads=2, num_kv_heads=1, seed=9)
    assert_close(run_kernel(batch, 0.2), run_reference(batch, 0.2), torch.float32)


def test_num_heads_not_a_multiple_of_kv_heads_is_rejected() -> None:
    batch = make_paged_batch([2], [0], num_heads=4, num_kv_heads=4)
    batch.query = batch.query[:, :3]
    with pytest.raises(ValueError, match="num_heads"):
        run_kernel(batch, 0.2)


def test_num_splits_below_one_is_rejected() -> None:
    batch = make_paged_batch([2], [0])
    with pytest.raises(ValueError, match="num_splits must be >= 1"):
        run_kernel(batch, 0.2, num_splits=0)


def test_query_start_loc_length_is_checked() -> None:
    batch = make_paged_batch([2, 1], [0, 3])
    batch.query_start_loc = batch.query_start_loc[:2]
    with pytest.raises(ValueError, match="query_start_loc"):
        run_kernel(batch, 0.2)
