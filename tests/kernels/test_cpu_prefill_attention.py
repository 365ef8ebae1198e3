"""The CPU prefill attention kernel against the pure-torch paged reference."""

from __future__ import annotations

import pytest
import torch

import strand.kernels.cpu_prefill_attention as cpu_prefill
from strand.kernels.cpu_prefill_attention import is_available, prefill_attention, unavailable_reason
from strand.kernels.paged_attention_ref import paged_attention_ref
from tests.kernels.paged_cases import scattered_paged_cache

pytestmark = pytest.mark.skipif(not is_available(),
                                reason=f"CPU kernel not built: {unavailable_reason()}")


def _case(query_lens: list[int], seq_lens: list[int], num_heads: int, num_kv_heads: int,
          head_dim: int, block_size: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    kv, table = scattered_paged_cache(seq_lens, num_kv_heads, head_dim, block_size, g)
    query = torch.randn(sum(query_lens), num_heads, head_dim, generator=g)
    starts = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    return query, kv, table, starts, torch.tensor(seq_lens, dtype=torch.int32)


@pytest.mark.parametrize(("query_lens", "seq_lens", "num_heads", "num_kv_heads", "head_dim",
                          "block_size"), [
    ([5, 40, 2], [5, 100, 2], 8, 4, 64, 16),  # fresh, after a cached prefix, tiny; GQA 2
    ([17, 33], [17, 70], 4, 4, 32, 16),  # MHA: 32 tokens a tile
    ([3, 64], [300, 64], 8, 2, 64, 32),  # GQA 4, block size 32, a short chunk late in context
    ([9, 30], [20, 30], 6, 2, 40, 16),  # GQA 3: tiles of 48 (30 without AVX-512), head_dim 40
    ([100, 37], [100, 120], 9, 3, 64, 16),  # SmolLM2's heads: 16 tokens of 3 fill a 48-row tile
    ([23], [50], 10, 2, 64, 16),  # GQA 5: 45 of 48 rows (30 of 32)
    ([7, 70], [7, 90], 64, 1, 36, 8),  # MQA, 64 heads: head chunks of 48 + 16 (or 2 x 32)
    ([100, 1], [100, 5], 16, 2, 128, 16),  # GQA 8, head_dim 128, a one-token request
    ([250], [700], 8, 4, 80, 16),  # long context over many chunks, 16-lane tail of head_dim
    ([31, 16], [31, 47], 4, 2, 64, 8),  # blocks smaller than a 32-key chunk
])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_the_paged_reference(query_lens: list[int], seq_lens: list[int], num_heads: int,
                                     num_kv_heads: int, head_dim: int, block_size: int,
                                     seed: int) -> None:
    query, kv, table, starts, lens = _case(query_lens, seq_lens, num_heads, num_kv_heads,
                                           head_dim, block_size, seed)
    scale = head_dim**-0.5
    out = torch.full_like(query, float("nan"))  # every row must be written
    prefill_attention(out, query, kv, table, starts[:-1], starts[1:] - starts[:-1], lens, scale)
    ref = paged_attention_ref(query, torch.nan_to_num(kv, nan=0.0), starts, lens, table, scale)
    assert not out.isnan().any()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_writes_only_the_rows_of_the_requests_given() -> None:
    # The backend hands over the prefills of a mixed step; the decodes' rows are not its own.
    query, kv, table, starts, lens = _case([1, 12, 1, 20], [9, 12, 30, 25], 8, 4, 64, 16, 3)
    out = torch.full_like(query, float("nan"))
    members = torch.tensor([1, 3])
    prefill_attention(out, query, kv, table[members], starts[members],
                      (starts[1:] - starts[:-1])[members], lens[members], 0.125)
    ref = paged_attention_ref(query, torch.nan_to_num(kv, nan=0.0), starts, lens, table, 0.125)
    untouched = torch.tensor([0, 13])  # the two one-token requests' rows
    assert out[untouched].isnan().all()
    written = torch.ones(len(query), dtype=torch.bool)
    written[untouched] = False
    torch.testing.assert_close(out[written], ref[written], atol=1e-5, rtol=1e-5)


def test_reads_strided_query_rows() -> None:
    # q as the engine hands it over: a view of the fused qkv projection, tokens strided.
    query, kv, table, starts, lens = _case([24, 8], [24, 40], 8, 4, 64, 16, 4)
    qkv = torch.randn(len(query), 16, 64)
    qkv[:, :8] = query
    strided = qkv[:, :8]
    assert not strided.is_contiguous()
    out = torch.empty_like(query)
    prefill_attention(out, strided, kv, table, starts[:-1], starts[1:] - starts[:-1], lens, 0.125)
    ref = paged_attention_ref(query, torch.nan_to_num(kv, nan=0.0), starts, lens, table, 0.125)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_refuses_other_dtypes_and_shapes_naming_them() -> None:
    query, kv, table, starts, lens = _case([4], [4], 4, 2, 32, 16, 0)
    q_lens = starts[1:] - starts[:-1]
    with pytest.raises(ValueError, match="float32 or bfloat16 query"):
        prefill_attention(torch.empty_like(query), query.half(), kv, table, starts[:-1], q_lens,
                          lens, 0.1)
    with pytest.raises(ValueError, match="kv_cache in the query's dtype"):
        prefill_attention(torch.empty_like(query).bfloat16(), query.bfloat16(), kv, table,
                          starts[:-1], q_lens, lens, 0.1)
    with pytest.raises(ValueError, match="out shape"):
        prefill_attention(torch.empty(3, 4, 32), query, kv, table, starts[:-1], q_lens, lens, 0.1)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        prefill_attention(torch.empty(4, 3, 32), query[:, :3], kv, table, starts[:-1], q_lens,
                          lens, 0.1)


@pytest.mark.parametrize(("query_lens", "seq_lens", "num_heads", "num_kv_heads", "head_dim"), [
    ([5, 40, 2], [5, 100, 2], 8, 4, 64),
    ([9, 30], [20, 30], 6, 2, 36),  # a head_dim tail: scalar bfloat16 reads and writes
    ([100, 1], [100, 5], 16, 2, 128),
])
def test_bfloat16_is_computed_in_float32_and_rounded_once(
        query_lens: list[int], seq_lens: list[int], num_heads: int, num_kv_heads: int,
        head_dim: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # The widening kernel; AMX's and VDPBF16PS's (rounded probabilities) have tests of their own.
    monkeypatch.setenv("STRAND_DISABLE_AMX", "1")
    monkeypatch.setattr(cpu_prefill, "pairs_applies", lambda dtype, head_dim: False)
    query, kv, table, starts, lens = _case(query_lens, seq_lens, num_heads, num_kv_heads,
                                           head_dim, 16, 6)
    query, kv = query.bfloat16(), kv.bfloat16()
    scale = head_dim**-0.5
    out = torch.full_like(query, float("nan"))
    prefill_attention(out, query, kv, table, starts[:-1], starts[1:] - starts[:-1], lens, scale)
    assert not out.isnan().any()
    # The exact answer for these bfloat16 inputs, rounded to bfloat16 once.
    ref = paged_attention_ref(query.float(), torch.nan_to_num(kv.float(), nan=0.0), starts,
                              lens, table, scale)
    torch.testing.assert_close(out.float(), ref.bfloat16().float(), atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize(("query_lens", "seq_lens", "num_heads", "num_kv_heads", "head_dim"), [
    ([5, 40, 2], [5, 100, 2], 8, 4, 64),
    ([100, 37], [100, 120], 9, 3, 64),  # SmolLM2's heads
    ([9, 30], [20, 30], 6, 2, 36),  # a head_dim tail: scalar bfloat16 reads
    ([250], [700], 8, 4, 80),
])
def test_a_float32_query_over_a_bfloat16_cache_reads_the_cache_widened(
        query_lens: list[int], seq_lens: list[int], num_heads: int, num_kv_heads: int,
        head_dim: int) -> None:
    # kv_cache_dtype="bfloat16" under float32 weights: each key chunk's rows are widened once
    # (exactly) and the products are the float32 kernel's, so are its bits.
    query, kv, table, starts, lens = _case(query_lens, seq_lens, num_heads, num_kv_heads,
                                           head_dim, 16, 8)
    kv = kv.bfloat16()
    scale = head_dim**-0.5
    q_lens = starts[1:] - starts[:-1]
    out = torch.full_like(query, float("nan"))
    prefill_attention(out, query, kv, table, starts[:-1], q_lens, lens, scale)
    widened = torch.full_like(query, float("nan"))
    prefill_attention(widened, query, kv.float(), table, starts[:-1], q_lens, lens, scale)
    assert out.dtype == torch.float32 and not out.isnan().any()
    torch.testing.assert_close(out, widened, atol=1e-6, rtol=1e-6)
    ref = paged_attention_ref(query, torch.nan_to_num(kv.float(), nan=0.0), starts, lens, table,
                              scale)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
