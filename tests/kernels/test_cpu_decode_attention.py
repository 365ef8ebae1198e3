"""The CPU decode attention kernel against the pure-torch paged reference."""

from __future__ import annotations

import pytest
import torch

from strand.kernels.cpu_decode_attention import decode_attention, is_available, unavailable_reason
from strand.kernels.paged_attention_ref import paged_attention_ref
from tests.kernels.paged_cases import scattered_paged_cache

pytestmark = pytest.mark.skipif(not is_available(),
                                reason=f"CPU kernel not built: {unavailable_reason()}")


def _case(seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
          block_size: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    kv, table = scattered_paged_cache(seq_lens, num_kv_heads, head_dim, block_size, g)
    query = torch.randn(len(seq_lens), num_heads, head_dim, generator=g)
    return query, kv, table, torch.tensor(seq_lens, dtype=torch.int32)


def _on_threads(threads: int, query: torch.Tensor, kv: torch.Tensor, table: torch.Tensor,
                lens: torch.Tensor) -> torch.Tensor:
    """decode_attention at scale 0.125 on `threads` threads (the tests' default is one)."""
    torch.set_num_threads(threads)
    try:
        return decode_attention(query, kv, table, lens, 0.125)
    finally:
        torch.set_num_threads(1)


@pytest.mark.parametrize(("seq_lens", "num_heads", "num_kv_heads", "head_dim", "block_size"), [
    ([1, 5, 16, 17, 100], 8, 4, 64, 16),  # GQA 2, block edges
    ([33, 2, 64], 4, 4, 32, 16),  # MHA
    ([300, 7], 8, 2, 64, 32),  # GQA 4, block size 32
    ([50, 51, 1], 6, 2, 40, 16),  # GQA 3, head_dim not a power of two
    ([20], 4, 1, 64, 16),  # MQA
    ([129, 3, 48], 16, 2, 128, 16),  # GQA 8, head_dim 128
    ([70, 1], 2, 1, 256, 16),  # head_dim 256
    ([31, 1, 90], 4, 2, 72, 16),  # head_dim with a 8-lane tail past whole vectors
    ([40, 8, 9], 4, 2, 80, 8),  # blocks smaller than a 16-token tile
    ([700, 250], 8, 4, 64, 32),  # long contexts over many tiles and blocks
])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_the_paged_reference(seq_lens: list[int], num_heads: int, num_kv_heads: int,
                                     head_dim: int, block_size: int, seed: int) -> None:
    query, kv, table, lens = _case(seq_lens, num_heads, num_kv_heads, head_dim, block_size, seed)
    scale = head_dim**-0.5
    out = decode_attention(query, kv, table, lens, scale)
    starts = torch.arange(len(seq_lens) + 1, dtype=torch.int32)
    ref = paged_attention_ref(query, torch.nan_to_num(kv, nan=0.0), starts, lens, table, scale)
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_refuses_other_dtypes_naming_them() -> None:
    query, kv, table, lens = _case([4], 4, 2, 32, 16, 0)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        decode_attention(query.half(), kv.half(), table, lens, 0.1)
    with pytest.raises(ValueError, match="of one dtype"):
        decode_attention(query.bfloat16(), kv, table, lens, 0.1)


@pytest.mark.parametrize(("seq_lens", "num_heads", "num_kv_heads", "head_dim", "block_size"), [
    ([1, 5, 16, 17, 100], 8, 4, 64, 16),
    ([31, 1, 90], 4, 2, 72, 16),  # a tail past whole vectors: scalar bfloat16 reads and writes
    ([700, 250], 8, 4, 128, 32),
    # Query heads taken together on each K/V row read: three (SmolLM2's heads), two of eight
    # (head_dim 128 leaves registers for two), four of eight (head_dim 32).
    ([150, 3, 33], 9, 3, 64, 16),
    ([129, 3, 48], 16, 2, 128, 16),
    ([40, 90], 8, 1, 32, 16),
])
def test_bfloat16_is_computed_in_float32_and_rounded_once(
        seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
        block_size: int) -> None:
    query, kv, table, lens = _case(seq_lens, num_heads, num_kv_heads, head_dim, block_size, 5)
    query, kv = query.bfloat16(), kv.bfloat16()
    scale = head_dim**-0.5
    out = decode_attention(query, kv, table, lens, scale)
    assert out.dtype == torch.bfloat16 and not out.isnan().any()
    starts = torch.arange(len(seq_lens) + 1, dtype=torch.int32)
    # The exact answer for these bfloat16 inputs, rounded to bfloat16 once.
    ref = paged_attention_ref(query.float(), torch.nan_to_num(kv.float(), nan=0.0), starts,
                              lens, table, scale)
    torch.testing.assert_close(out.float(), ref.bfloat16().float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("seq_lens", "num_kv_heads"), [([300], 3), ([77], 1), ([5, 140], 4)])
def test_fewer_requests_than_threads_split_by_kv_head_and_give_the_same_bits(
        dtype: torch.dtype, seq_lens: list[int], num_kv_heads: int) -> None:
    # With more threads than requests each (request, kv head) is a task of its own; each head's
    # sums are the same as in one thread, in the same order.
    query, kv, table, lens = _case(seq_lens, 3 * num_kv_heads, num_kv_heads, 64, 16, 7)
    query, kv = query.to(dtype), kv.to(dtype)
    split = _on_threads(4, query, kv, table, lens)
    assert torch.equal(split, decode_attention(query, kv, table, lens, 0.125))
    starts = torch.arange(len(seq_lens) + 1, dtype=torch.int32)
    ref = paged_attention_ref(query.float(), torch.nan_to_num(kv.float(), nan=0.0), starts, lens,
                              table, 0.125)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(split.float(), ref.to(dtype).float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("threads", [2, 3])
def test_requests_claimed_by_several_threads_give_one_thread_s_bits(threads: int) -> None:
    # Each thread claims its next request while it works on one (to fetch that request's first
    # blocks meanwhile): every request is still computed once, whichever thread takes it.
    seq_lens = [1, 16, 17, 40, 3, 64, 33, 2, 90, 15, 48, 5]
    query, kv, table, lens = _case(seq_lens, 6, 2, 64, 16, 11)
    several = _on_threads(threads, query, kv, table, lens)
    assert torch.equal(several, decode_attention(query, kv, table, lens, 0.125))
    starts = torch.arange(len(seq_lens) + 1, dtype=torch.int32)
    ref = paged_attention_ref(query, torch.nan_to_num(kv, nan=0.0), starts, lens, table, 0.125)
    torch.testing.assert_close(several, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("seq_lens", "num_heads", "num_kv_heads", "head_dim", "block_size"), [
    ([1, 5, 16, 17, 100], 8, 4, 64, 16),
    ([150, 3, 33], 9, 3, 64, 16),  # SmolLM2's heads
    ([31, 1, 90], 4, 2, 72, 16),  # a tail past whole vectors: scalar bfloat16 reads
    ([40, 8, 9], 4, 2, 80, 8),
    ([129, 3, 48], 16, 2, 128, 16),
])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_float32_query_over_a_bfloat16_cache_reads_the_cache_widened(
        seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
        block_size: int, threads: int) -> None:
    # kv_cache_dtype="bfloat16" under float32 weights: each cache row is widened (exactly) as it
    # is loaded and the rest is the float32 kernel's arithmetic, so the answer is the float32
    # kernel's over the widened cache (to the last bit where the compiler contracts the same
    # multiply-adds; AVX2's head_dim 80 differs in the last place).
    query, kv, table, lens = _case(seq_lens, num_heads, num_kv_heads, head_dim, block_size, 9)
    kv = kv.bfloat16()
    scale = head_dim**-0.5
    torch.set_num_threads(threads)
    try:
        out = decode_attention(query, kv, table, lens, scale)
        widened = decode_attention(query, kv.float(), table, lens, scale)
    finally:
        torch.set_num_threads(1)
    assert out.dtype == torch.float32 and not out.isnan().any()
    torch.testing.assert_close(out, widened, atol=1e-6, rtol=1e-6)
    starts = torch.arange(len(seq_lens) + 1, dtype=torch.int32)
    ref = paged_attention_ref(query, torch.nan_to_num(kv.float(), nan=0.0), starts, lens, table,
                              scale)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
