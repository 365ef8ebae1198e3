"""The bfloat16 prefill attention kernels that round P to bfloat16 (AMX tiles, VDPBF16PS pairs)
against the float64 paged reference.

Both round the probabilities to bfloat16 for P.V (as torch's flash kernel does) and the output
once, so each is compared with the exact attention of the same bfloat16 inputs at a bfloat16
tolerance, and its mean error is held to a few output roundings: a wrong mask, head or chunk
rescale is off by far more. Every case runs on each kernel the CPU has; AMX takes head_dims that
are multiples of 32, the pairs kernel any even one (its scalar tails: 34, 36, 40, 80).
"""

from __future__ import annotations

import pytest
import torch

import strand.kernels.cpu_prefill_attention as cpu_prefill
from strand.kernels.cpu_prefill_attention import amx_applies, pairs_applies, prefill_attention
from strand.kernels.paged_attention_ref import paged_attention_ref
from strand.platform.cpu_isa import CpuIsa
from tests.kernels.test_cpu_prefill_attention import _case as float_case


@pytest.fixture(params=["amx", "pairs"])
def kernel(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which kernel runs the test's calls: AMX where the CPU has it, else skipped; the pairs
    kernel with AMX turned off (where AMX is, it would take the calls)."""
    if request.param == "pairs":
        monkeypatch.setenv("STRAND_DISABLE_AMX", "1")
    applies = amx_applies if request.param == "amx" else pairs_applies
    if not applies(torch.bfloat16, 64):
        pytest.skip(f"{request.param} does not run here (the CPU, STRAND_CPU_ISA below avx512, "
                    f"or STRAND_DISABLE_AMX / STRAND_DISABLE_AVX512_BF16)")
    return str(request.param)


def _takes(kernel: str, head_dim: int) -> None:
    applies = amx_applies if kernel == "amx" else pairs_applies
    if not applies(torch.bfloat16, head_dim):
        pytest.skip(f"{kernel} does not take head_dim {head_dim}")


def _case(query_lens: list[int], seq_lens: list[int], num_heads: int, num_kv_heads: int,
          head_dim: int, block_size: int, seed: int) -> tuple[torch.Tensor, ...]:
    query, kv, table, starts, lens = float_case(query_lens, seq_lens, num_heads, num_kv_heads,
                                                head_dim, block_size, seed)
    return query.bfloat16(), kv.bfloat16(), table, starts, lens


def _reference(query: torch.Tensor, kv: torch.Tensor, table: torch.Tensor, starts: torch.Tensor,
               lens: torch.Tensor, scale: float) -> torch.Tensor:
    return paged_attention_ref(query.double(), torch.nan_to_num(kv.double(), nan=0.0), starts,
                               lens, table, scale).float()


def _run(query: torch.Tensor, kv: torch.Tensor, table: torch.Tensor, starts: torch.Tensor,
         lens: torch.Tensor, scale: float) -> torch.Tensor:
    out = torch.full_like(query, float("nan"))  # every row must be written
    prefill_attention(out, query, kv, table, starts[:-1], starts[1:] - starts[:-1], lens, scale)
    return out


def _check(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert not out.isnan().any()
    err = (out.float() - ref).abs()
    # An output rounding is up to 2^-9 of the value; P's rounding adds noise of that order.
    torch.testing.assert_close(out.float(), ref, atol=1.6e-2, rtol=1.6e-2)
    assert float(err.mean()) < 2e-3 * max(float(ref.abs().mean()), 0.1)


@pytest.mark.parametrize(("query_lens", "seq_lens", "num_heads", "num_kv_heads", "head_dim",
                          "block_size"), [
    ([512], [512], 9, 3, 64, 16),  # SmolLM2's layer: one fresh prompt, GQA 3
    ([5, 40, 2, 1], [5, 100, 2, 9], 8, 4, 64, 16),  # fresh, after a cached prefix, tiny, 1 token
    ([17, 33], [17, 70], 4, 4, 32, 16),  # MHA, head_dim 32 (one reduction chunk)
    ([37, 3], [300, 64], 8, 2, 96, 32),  # head_dim 96: three chunks, the last without a pair
    ([250], [700], 8, 4, 128, 16),  # many key chunks: the online rescale
    ([300, 17], [600, 17], 9, 3, 256, 8),  # head_dim 256 (4 output groups), blocks of 8
    ([7, 70], [7, 90], 16, 1, 64, 8),  # MQA
    ([31, 16, 1, 33], [31, 47, 1, 257], 4, 2, 64, 16),  # odd lengths around the 16/32 edges
    ([9, 30], [20, 30], 6, 2, 36, 16),  # pairs only: a 16-lane tail and a kBlock tail of 4
    ([17, 33], [17, 71], 4, 4, 40, 16),  # pairs only: 71 keys, a chunk ending on an odd key
    ([250], [700], 8, 4, 80, 16),  # pairs only: head_dim 80
    ([7, 70], [7, 90], 64, 1, 34, 8),  # pairs only: 64 heads in tiles of 48 + 16; head_dim 34
])
def test_matches_the_exact_attention_of_the_bfloat16_inputs(
        kernel: str, query_lens: list[int], seq_lens: list[int], num_heads: int,
        num_kv_heads: int, head_dim: int, block_size: int) -> None:
    _takes(kernel, head_dim)
    query, kv, table, starts, lens = _case(query_lens, seq_lens, num_heads, num_kv_heads,
                                           head_dim, block_size, seed=len(query_lens))
    scale = head_dim**-0.5
    _check(_run(query, kv, table, starts, lens, scale),
           _reference(query, kv, table, starts, lens, scale))


def test_two_threads_split_the_tasks(kernel: str) -> None:
    query, kv, table, starts, lens = _case([100, 3, 60], [100, 40, 300], 9, 3, 64, 16, seed=9)
    torch.set_num_threads(2)  # the conftest fixture sets 1 again for the next test
    out = _run(query, kv, table, starts, lens, 0.125)
    _check(out, _reference(query, kv, table, starts, lens, 0.125))


def test_large_scores_stay_finite_and_exact(kernel: str) -> None:
    # Scores in the hundreds: the softmax must subtract the running maximum.
    query, kv, table, starts, lens = _case([40, 260], [300, 260], 6, 2, 64, 16, seed=5)
    query = (query.float() * 30).bfloat16()
    out = _run(query, kv, table, starts, lens, 0.125)
    _check(out, _reference(query, kv, table, starts, lens, 0.125))


def test_writes_only_the_given_requests_rows_and_reads_strided_queries(kernel: str) -> None:
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


def test_is_the_path_taken_and_agrees_with_the_widening_kernel(
        kernel: str, monkeypatch: pytest.MonkeyPatch) -> None:
    query, kv, table, starts, lens = _case([100, 37], [100, 120], 9, 3, 64, 16, seed=7)
    rounded = _run(query, kv, table, starts, lens, 0.125)
    monkeypatch.setenv("STRAND_DISABLE_AMX", "1")
    monkeypatch.setattr(cpu_prefill, "pairs_applies", lambda dtype, head_dim: False)
    widened = _run(query, kv, table, starts, lens, 0.125)  # float32 sums, rounded once
    assert not torch.equal(rounded, widened)  # P rounded to bfloat16: another kernel ran
    torch.testing.assert_close(rounded, widened, atol=1.6e-2, rtol=1.6e-2)


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


def test_pairs_only_at_the_avx512_level_with_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("STRAND_DISABLE_AVX512_BF16", raising=False)
    assert _isa("avx512", {"avx512_bf16"}).avx512_bf16
    assert not _isa("avx2", {"avx512_bf16"}).avx512_bf16  # STRAND_CPU_ISA=avx2 never takes it
    assert not _isa("avx512", {"avx512_vnni"}).avx512_bf16  # Skylake-X, Ice Lake
    monkeypatch.setenv("STRAND_DISABLE_AVX512_BF16", "")  # set at all, as the C++ reads it
    assert not _isa("avx512", {"avx512_bf16"}).avx512_bf16


def test_other_dtypes_and_head_dims_keep_the_other_kernels() -> None:
    assert not amx_applies(torch.float32, 64)
    assert not amx_applies(torch.bfloat16, 40)  # not a multiple of 32
    assert not amx_applies(torch.bfloat16, 288)  # past the kernel's 256
    assert not pairs_applies(torch.float32, 64)
    assert not pairs_applies(torch.bfloat16, 63)  # the pairs need an even head_dim
