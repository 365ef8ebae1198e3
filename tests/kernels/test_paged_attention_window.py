"""Triton paged attention with a sliding window and logit soft-capping (Gemma 2/3, Mistral)
against the pure-torch reference."""

from __future__ import annotations

import pytest
import torch

from strand.kernels.paged_attention import paged_attention
from strand.kernels.paged_attention_ref import paged_attention_ref
from tests.kernels.conftest import PagedBatch, assert_close, make_paged_batch, poisoned_like


def run(batch: PagedBatch, fn: str, **kwargs: object) -> torch.Tensor:
    args = (batch.query, batch.kv_cache)
    if fn == "ref":
        return paged_attention_ref(*args, batch.query_start_loc, batch.seq_lens,
                                   batch.block_table, 0.2, **kwargs)  # type: ignore[arg-type]
    out = poisoned_like(batch.query)
    return paged_attention(*args, out, batch.query_start_loc, batch.seq_lens, batch.block_table,
                           0.2, batch.max_query_len, batch.max_seq_len,
                           **kwargs)  # type: ignore[arg-type]


# Chunks and decodes whose contexts run well past the window, and one shorter than it.
MIXED = ([9, 1, 24, 1], [40, 70, 7, 3])


@pytest.mark.parametrize("num_splits", [1, 3])
def test_window_matches_reference(num_splits: int) -> None:
    batch = make_paged_batch(*MIXED, num_heads=8, num_kv_heads=2, seed=11)
    kwargs = {"sliding_window": 13}
    expected = run(batch, "ref", **kwargs)
    assert_close(run(batch, "kernel", num_splits=num_splits, tile_n=16, **kwargs), expected,
                 torch.float32)
    # The window changed the answer: the reference without it differs.
    assert not torch.allclose(expected, run(batch, "ref"), atol=1e-3)


def test_softcap_with_window_matches_reference() -> None:
    batch = make_paged_batch(*MIXED, num_heads=4, num_kv_heads=4, seed=12)
    kwargs = {"sliding_window": 20, "softcap": 0.5}
    expected = run(batch, "ref", **kwargs)
    assert_close(run(batch, "kernel", **kwargs), expected, torch.float32)
    assert not torch.allclose(expected, run(batch, "ref", sliding_window=20), atol=1e-3)


def test_bad_window_and_softcap_are_rejected() -> None:
    batch = make_paged_batch([1], [5], seed=1)
    with pytest.raises(ValueError, match="sliding_window must be >= 1"):
        run(batch, "kernel", sliding_window=0)
    with pytest.raises(ValueError, match="softcap must be > 0"):
        run(batch, "kernel", softcap=0.0)
