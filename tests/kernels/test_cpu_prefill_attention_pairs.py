"""The bfloat16 prefill attention by VDPBF16PS (AVX512_BF16, no AMX) against the float64 paged
reference.

Like the AMX kernel it rounds the probabilities to bfloat16 for P.V, so it is held to the AMX
tests' bfloat16 tolerance and mean error (tests/kernels/test_cpu_prefill_attention_amx.py). Its
cases add what AMX does not take: head_dims that are not multiples of 32 or 16 (the pair kernel
has scalar tails), and key chunks that end on an odd key (a pair whose second half is masked).
"""

from __future__ import annotations

import pytest
import torch

import kernels.cpu_prefill_attention as cpu_prefill
from kernels.cpu_isa import CpuIsa
from kernels.cpu_prefill_attention import pairs_applies, prefill_attention
from tests.kernels.test_cpu_prefill_attention_amx import _case, _check, _reference

needs_pairs = pytest.mark.skipif(
    not pairs_applies(torch.bfloat16, 64),
    reason="no AVX512_BF16 here (or STRAND_CPU_ISA below avx512, or STRAND_DISABLE_AVX512_BF16)")


@pytest.fixture(autouse=True)
def _without_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRAND_DISABLE_AMX", "1")  # where AMX is, it would take these calls


def _run(query: torch.Tensor, kv: torch.Tensor, table: torch.Tensor, starts: torch.Tensor,
         lens: torch.Tensor, scale: float) -> torch.Tensor:
    out = torch.full_like(query, float("nan"))  # every row must be written
    prefill_attention(out, query, kv, table, starts[:-1], starts[1:] - starts[:-1], lens, scale)
    return out


@needs_pairs
@pytest.mark.parametrize(("query_lens", "seq_lens", "num_heads", "num_kv_heads", "head_dim",
                          "block_size"), [
    ([512], [512], 9, 3, 64, 16),  # SmolLM2's layer: one fresh prompt, GQA 3, 48-row tiles
    ([5, 40, 2, 1], [5, 100, 2, 9], 8, 4, 64, 16),  # fresh, after a cached prefix, tiny, 1 token
    ([9, 30], [20, 30], 6, 2, 36, 16),  # head_dim 36: a 16-lane tail and a kBlock tail of 4
    ([17, 33], [17, 71], 4, 4, 40, 16),  # MHA, head_dim 40; 71 keys: a chunk ending on key 6
    ([250], [700], 8, 4, 80, 16),  # many chunks: the online rescale; head_dim 80
    ([37, 3], [300, 64], 8, 2, 96, 32),  # GQA 4, block size 32
    ([100, 1], [100, 5], 16, 2, 128, 16),  # GQA 8, head_dim 128, a one-token request
    ([7, 70], [7, 90], 64, 1, 34, 8),  # MQA, 64 heads: tiles of 48 + 16 heads; head_dim 34
    ([31, 16, 1, 33], [31, 47, 1, 257], 4, 2, 64, 16),  # odd lengths around the 16/32 edges
])
def test_matches_the_exact_attention_of_the_bfloat16_inputs(
        query_lens: list[int], seq_lens: list[int], num_heads: int, num_kv_heads: int,
        head_dim: int, block_size: int) -> None:
    query, kv, table, starts, lens = _case(query_lens, seq_lens, num_heads, num_kv_heads,
                                           head_dim, block_size, seed=len(query_lens))
    scale = head_dim**-0.5
    out = _run(query, kv, table, starts, lens, scale)
    _check(out, _reference(query, kv, table, starts, lens, scale))


@needs_pairs
def test_two_threads_split_the_tiles() -> None:
    query, kv, table, starts, lens = _case([100, 3, 60], [100, 40, 300], 9, 3, 64, 16, seed=9)
    torch.set_num_threads(2)  # the conftest fixture sets 1 again for the next test
    out = _run(query, kv, table, starts, lens, 0.125)
    _check(out, _reference(query, kv, table, starts, lens, 0.125))


@needs_pairs
def test_large_scores_stay_finite_and_exact() -> None:
    # Scores in the hundreds: the softmax must subtract the running maximum.
    query, kv, table, starts, lens = _case([40, 260], [300, 260], 6, 2, 64, 16, seed=5)
    query = (query.float() * 30).bfloat16()
    out = _run(query, kv, table, starts, lens, 0.125)
    _check(out, _reference(query, kv, table, starts, lens, 0.125))


@needs_pairs
def test_writes_only_the_given_requests_rows_and_reads_strided_queries() -> None:
    query, kv, table, starts, lens = _case([1, 40, 1, 21], [9, 40, 30, 25], 6, 3, 64, 16, seed=3)
    qkv = torch.randn(len(query), 12, 64).bfloat16()  # q as a view of a fused projection
    qkv[:, :6] = query
    out = torch.full_like(query, float("nan"))
    members = torch.tensor([1, 3])
    prefill_attention(out, qkv[:, :6], kv, table[members], starts[members],
                      (starts[1:] - starts[:-1])[members], lens[members], 0.125)
    ref = _reference(query, kv, table, starts, lens, 0.125)
    untouched = torch.tensor([0, 41])  # the one-token requests' rows
    assert out[untouched].isnan().all()
    written = torch.ones(len(query), dtype=torch.bool)
    written[untouched] = False
    _check(out[written], ref[written])


@needs_pairs
def test_is_the_path_taken_and_agrees_with_the_widening_kernel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    query, kv, table, starts, lens = _case([100, 37], [100, 120], 9, 3, 64, 16, seed=7)
    pairs = _run(query, kv, table, starts, lens, 0.125)
    monkeypatch.setattr(cpu_prefill, "pairs_applies", lambda dtype, head_dim: False)
    widened = _run(query, kv, table, starts, lens, 0.125)  # float32 sums, rounded once
    assert not torch.equal(pairs, widened)  # P rounded to bfloat16: another kernel ran
    torch.testing.assert_close(pairs, widened, atol=1.6e-2, rtol=1.6e-2)


def _isa(level: str, flags: set[str]) -> CpuIsa:
    return CpuIsa(machine="x86_64", detected="avx512", level=level, flags=frozenset(flags))


def test_only_at_the_avx512_level_with_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STRAND_DISABLE_AVX512_BF16", raising=False)
    assert _isa("avx512", {"avx512_bf16"}).avx512_bf16
    assert not _isa("avx2", {"avx512_bf16"}).avx512_bf16  # STRAND_CPU_ISA=avx2 never takes it
    assert not _isa("avx512", {"avx512_vnni"}).avx512_bf16  # Skylake-X, Ice Lake
    monkeypatch.setenv("STRAND_DISABLE_AVX512_BF16", "")  # set at all, as the C++ reads it
    assert not _isa("avx512", {"avx512_bf16"}).avx512_bf16


def test_other_dtypes_and_head_dims_keep_the_widening_kernel() -> None:
    assert not pairs_applies(torch.float32, 64)
    assert not pairs_applies(torch.bfloat16, 63)  # the pairs need an even head_dim
