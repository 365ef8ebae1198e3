"""The bfloat16 prefill attention on AMX tiles against the float64 paged reference.

The kernel rounds the probabilities to bfloat16 for P.V (as torch's flash kernel does) and the
output once, so it is compared with the exact attention of the same bfloat16 inputs at a
bfloat16 tolerance, and its mean error is held to a few output roundings: a wrong mask, head or
chunk rescale is off by far more.
"""

from __future__ import annotations

import pytest
import torch

from kernels.cpu_isa import CpuIsa
from kernels.cpu_prefill_attention import amx_applies, prefill_attention
from kernels.paged_attention_ref import paged_attention_ref
from tests.kernels.paged_cases import scattered_paged_cache

AMX = amx_applies(torch.bfloat16, 64)
needs_amx = pytest.mark.skipif(not AMX, reason="no AMX-BF16 here (or STRAND_CPU_ISA below "
                                               "avx512, or STRAND_DISABLE_AMX)")


def _case(query_lens: list[int], seq_lens: list[int], num_heads: int, num_kv_heads: int,
          head_dim: int, block_size: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    kv, table = scattered_paged_cache(seq_lens, num_kv_heads, head_dim, block_size, g)
    query = torch.randn(sum(query_lens), num_heads, head_dim, generator=g)
    starts = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    return (query.bfloat16(), kv.bfloat16(), table, starts,
            torch.tensor(seq_lens, dtype=torch.int32))


def _reference(query: torch.Tensor, kv: torch.Tensor, table: torch.Tensor, starts: torch.Tensor,
               lens: torch.Tensor, scale: float) -> torch.Tensor:
    return paged_attention_ref(query.double(), torch.nan_to_num(kv.double(), nan=0.0), starts,
                               lens, table, scale).float()


def _check(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert not out.isnan().any()
    err = (out.float() - ref).abs()
    # An output rounding is up to 2^-9 of the value; P's rounding adds noise of that order.
    torch.testing.assert_close(out.float(), ref, atol=1.6e-2, rtol=1.6e-2)
    assert float(err.mean()) < 2e-3 * max(float(ref.abs().mean()), 0.1)


@needs_amx
@pytest.mark.parametrize(("query_lens", "seq_lens", "num_heads", "num_kv_heads", "head_dim",
                          "block_size"), [
    ([512], [512], 9, 3, 64, 16),  # SmolLM2's layer: one fresh prompt, GQA 3
    ([5, 40, 2, 1], [5, 100, 2, 9], 8, 4, 64, 16),  # fresh, after a cached prefix, tiny, 1 token
    ([17, 33], [17, 70], 4, 4, 32, 16),  # MHA, head_dim 32 (one reduction chunk)
    ([37, 3], [300, 64], 8, 2, 96, 32),  # head_dim 96: three chunks, the last without a pair
    ([250], [700], 8, 4, 128, 16),  # three 256-key chunks: the online rescale
    ([300, 17], [600, 17], 9, 3, 256, 8),  # head_dim 256 (4 output groups), blocks of 8
    ([7, 70], [7, 90], 16, 1, 64, 8),  # MQA
    ([31, 16, 1, 33], [31, 47, 1, 257], 4, 2, 64, 16),  # odd lengths around the 16/32 edges
])
def test_matches_the_exact_attention_of_the_bfloat16_inputs(
        query_lens: list[int], seq_lens: list[int], num_heads: int, num_kv_heads: int,
        head_dim: int, block_size: int) -> None:
    query, kv, table, starts, lens = _case(query_lens, seq_lens, num_heads, num_kv_heads,
                                           head_dim, block_size, seed=len(query_lens))
    scale = head_dim**-0.5
    out = torch.full_like(query, float("nan"))  # every row must be written
    prefill_attention(out, query, kv, table, starts[:-1], starts[1:] - starts[:-1], lens, scale)
    _check(out, _reference(query, kv, table, starts, lens, scale))


@needs_amx
def test_two_threads_split_the_tasks_and_the_packing() -> None:
    query, kv, table, starts, lens = _case([100, 3, 60], [100, 40, 300], 9, 3, 64, 16, seed=9)
    out = torch.full_like(query, float("nan"))
    torch.set_num_threads(2)  # the conftest fixture sets 1 again for the next test
    prefill_attention(out, query, kv, table, starts[:-1], starts[1:] - starts[:-1], lens, 0.125)
    _check(out, _reference(query, kv, table, starts, lens, 0.125))


@needs_amx
def test_large_scores_stay_finite_and_exact() -> None:
    # Scores in the hundreds: the softmax must subtract the running maximum.
    query, kv, table, starts, lens = _case([40, 260], [300, 260], 6, 2, 64, 16, seed=5)
    query = (query.float() * 30).bfloat16()
    out = torch.full_like(query, float("nan"))
    prefill_attention(out, query, kv, table, starts[:-1], starts[1:] - starts[:-1], lens, 0.125)
    _check(out, _reference(query, kv, table, starts, lens, 0.125))


@needs_amx
def test_writes_only_the_given_requests_rows_and_reads_strided_queries() -> None:
    query, kv, table, starts, lens = _case([1, 40, 1, 21], [9, 40, 30, 25], 6, 3, 64, 16, seed=3)
    qkv = torch.randn(len(query), 12, 64).bfloat16()  # q as a view of a fused projection
    qkv[:, :6] = query
    strided = qkv[:, :6]
    out = torch.full_like(query, float("nan"))
    members = torch.tensor([1, 3])
    prefill_attention(out, strided, kv, table[members], starts[members],
                      (starts[1:] - starts[:-1])[members], lens[members], 0.125)
    ref = _reference(query, kv, table, starts, lens, 0.125)
    untouched = torch.tensor([0, 41])  # the one-token requests' rows
    assert out[untouched].isnan().all()
    written = torch.ones(len(query), dtype=torch.bool)
    written[untouched] = False
    _check(out[written], ref[written])


@needs_amx
def test_agrees_with_the_kernel_without_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    query, kv, table, starts, lens = _case([100, 37], [100, 120], 9, 3, 64, 16, seed=7)
    args = (query, kv, table, starts[:-1], starts[1:] - starts[:-1], lens, 0.125)
    amx = torch.empty_like(query)
    prefill_attention(amx, *args)
    monkeypatch.setenv("STRAND_DISABLE_AMX", "1")
    assert not amx_applies(torch.bfloat16, 64)
    plain = torch.empty_like(query)
    prefill_attention(plain, *args)  # float32 sums, rounded once
    torch.testing.assert_close(amx, plain, atol=1.6e-2, rtol=1.6e-2)


def _isa(level: str, flags: set[str]) -> CpuIsa:
    return CpuIsa(machine="x86_64", detected="avx512", level=level, flags=frozenset(flags))


def test_amx_only_at_the_avx512_level_with_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STRAND_DISABLE_AMX", raising=False)
    both = {"amx_bf16", "amx_tile"}
    assert _isa("avx512", both).amx_bf16
    assert not _isa("avx2", both).amx_bf16  # STRAND_CPU_ISA=avx2 never takes AMX
    assert not _isa("avx512", {"amx_tile"}).amx_bf16
    monkeypatch.setenv("STRAND_DISABLE_AMX", "1")
    assert not _isa("avx512", both).amx_bf16


def test_other_dtypes_and_head_dims_keep_the_other_kernels() -> None:
    assert not amx_applies(torch.float32, 64)
    assert not amx_applies(torch.bfloat16, 40)  # not a multiple of 32
    assert not amx_applies(torch.bfloat16, 288)  # past the kernel's 256
