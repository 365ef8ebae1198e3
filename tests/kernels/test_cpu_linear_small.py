"""The few-row linear kernel (strand/kernels/csrc/linear_small.cpp) in bfloat16, on every path it has,
and in float32.

Without AVX512_BF16 (AVX2-only CPUs; run these under STRAND_CPU_ISA=avx2 too) the kernel reads
the weights as 32-bit pairs and x laid out as evens then odds per chunk of 2 x register-width
values: a swapped pair or a misplaced chunk gives a wrong sum, which an identity weight shows
exactly. STRAND_DISABLE_AVX512_BF16=1 makes an AVX-512 CPU take that path at AVX-512 width, as
one without AVX512_BF16 would (a subprocess: the C++ side reads it once).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from strand.kernels import cpu_linear

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _built() -> None:
    if not cpu_linear.small_m_applies(torch.empty(4, 4)):
        pytest.skip("CPU kernels not built")


# 16 and 32 values are one chunk at AVX2 and AVX-512 width; the others leave a remainder.
@pytest.mark.parametrize("features", [16, 32, 40, 47, 96, 577])
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_an_identity_weight_gives_x_back_exactly(features: int, rows: int) -> None:
    g = torch.Generator().manual_seed(features + rows)
    x = torch.randn(rows, features, generator=g).bfloat16()
    got = cpu_linear.linear_small(x, torch.eye(features).bfloat16(), None)
    # Every output is one bfloat16 value times 1 plus zeros: exact, wherever its feature sits.
    assert torch.equal(got, x)


@pytest.mark.parametrize("outputs", [1, 7, 9, 130])
@pytest.mark.parametrize("rows", [1, 2, 4])
def test_every_group_of_weight_rows_matches_float32_sums(outputs: int, rows: int) -> None:
    # Fewer rows than a group, a partial group after whole ones, many groups over the threads.
    g = torch.Generator().manual_seed(outputs * 7 + rows)
    x = torch.randn(rows, 200, generator=g).bfloat16()
    w = torch.randn(outputs, 200, generator=g).bfloat16()
    want = F.linear(x.float(), w.float())
    got = cpu_linear.linear_small(x, w, None)
    # One bfloat16 rounding of float32 sums (in another order): within one bfloat16 step.
    torch.testing.assert_close(got.float(), want, rtol=8e-3, atol=8e-3 * want.abs().max().item())


def test_outputs_round_to_nearest_ties_to_even() -> None:
    # 1 + 2^-8 lies halfway between bfloat16 1 and 1 + 2^-7: to 1 (even); 1 + 2^-7 + 2^-8 lies
    # halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up, as torch rounds float32 to bfloat16.
    x = torch.ones(1, 2).bfloat16()
    w = torch.tensor([[1.0, 2**-8], [1 + 2**-7, 2**-8], [-1.0, -(2**-8)]]).bfloat16()
    got = cpu_linear.linear_small(x, w, None)
    assert got.float().tolist() == [[1.0, 1 + 2**-6, -1.0]]
    assert torch.equal(got, F.linear(x.float(), w.float()).bfloat16())


def test_a_nan_weight_gives_nan_and_infinities_stay_infinite() -> None:
    x = torch.ones(1, 48).bfloat16()
    w = torch.zeros(3, 48)
    w[0, 17] = float("nan")
    w[1, 30] = float("inf")
    w[2, 47] = float("-inf")  # in the remainder past the whole chunks at AVX-512 width
    got = cpu_linear.linear_small(x, w.bfloat16(), None).float()[0]
    assert got[0].isnan() and got[1].item() == float("inf") and got[2].item() == float("-inf")


@pytest.mark.parametrize("features", [8, 16, 40, 577])
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_float32_an_identity_weight_gives_x_back_exactly(features: int, rows: int) -> None:
    # A row read from the wrong place, a lane summed twice or the remainder past the whole
    # vectors dropped: one output off, exactly.
    g = torch.Generator().manual_seed(features * 5 + rows)
    x = torch.randn(rows, features, generator=g)
    assert torch.equal(cpu_linear.linear_small(x, torch.eye(features), None), x)


@pytest.mark.parametrize("outputs", [1, 3, 9, 17, 130])
@pytest.mark.parametrize("rows", [1, 2, 3, 4])
def test_float32_every_group_of_weight_rows_matches_torch(outputs: int, rows: int) -> None:
    # Groups of 8, 4 or 2 weight rows (by rows of x): fewer than a group, a partial group after
    # whole ones, a bias on every output.
    g = torch.Generator().manual_seed(outputs * 11 + rows)
    x = torch.randn(rows, 203, generator=g)
    w = torch.randn(outputs, 203, generator=g)
    b = torch.randn(outputs, generator=g)
    got = cpu_linear.linear_small(x, w, b)
    torch.testing.assert_close(got, F.linear(x.double(), w.double(), b.double()).float(),
                               rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3])
def test_threads_claiming_chunks_give_the_one_thread_bits(dtype: torch.dtype, rows: int) -> None:
    # 1000 outputs at 3 threads: 12 chunks of whole row groups that the threads claim; every
    # output is computed once, by one thread, in the same order as at one thread.
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 96, generator=g).to(dtype)
    w = torch.randn(1000, 96, generator=g).to(dtype)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_linear.linear_small(x, w, None)
        torch.set_num_threads(3)
        three = cpu_linear.linear_small(x, w, None)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(three, one)
    want = F.linear(x.double(), w.double())
    torch.testing.assert_close(three.double(), want, rtol=8e-3, atol=8e-3 * want.abs().max().item())


_CHILD = """
import torch, torch.nn.functional as F
from strand.kernels import cpu_linear
g = torch.Generator().manual_seed(5)
for dtype, tol in ((torch.bfloat16, 8e-3), (torch.float32, 1e-5)):
    for rows in (1, 2, 3, 4):
        for features in (32, 64, 47, 96, 130, 576):
            x = torch.randn(rows, features, generator=g).to(dtype)
            assert torch.equal(cpu_linear.linear_small(x, torch.eye(features).to(dtype), None), x)
            w = torch.randn(37, features, generator=g).to(dtype)
            b = torch.randn(37, generator=g).to(dtype)
            want = F.linear(x.double(), w.double(), b.double())
            got = cpu_linear.linear_small(x, w, b).double()
            torch.testing.assert_close(got, want, rtol=tol, atol=tol * want.abs().max().item())
print("ok")
"""


# Each is read once by the C++ side, so each runs in a process of its own: the bfloat16 path an
# AVX-512 CPU without AVX512_BF16 takes, at full width; the grouped row order (the A/B switch
# against the default of a row at a time, linear_small_seq.h), with and without AVX512_BF16.
@pytest.mark.parametrize("env", [{"STRAND_DISABLE_AVX512_BF16": "1"},
                                 {"STRAND_SMALL_ROWS_GROUPED": "1"},
                                 {"STRAND_SMALL_ROWS_GROUPED": "1",
                                  "STRAND_DISABLE_AVX512_BF16": "1"}],
                         ids=["no-avx512-bf16", "grouped", "grouped-no-avx512-bf16"])
def test_every_path_switched_by_the_environment(env: dict[str, str]) -> None:
    env = {**os.environ, **env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
