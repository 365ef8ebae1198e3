"""Strand's bfloat16 GEMM on panel-packed weights (strand/kernels/csrc/linear_panels_bf16.cpp)
against float32 sums rounded to bfloat16: row counts from one to whole and partial tiles past
them, outputs that end in a partial panel, odd and even inputs (an odd one's last pair padded),
bias or none (bfloat16 or float32), one thread and several; the panel layout; its argument
checks. Runs under any ISA the kernels are built for: at the avx512 level on a CPU with
AVX512_BF16 the kernel multiplies by VDPBF16PS, and a subprocess covers the widening path with
STRAND_DISABLE_AVX512_BF16=1; run it again under STRAND_CPU_ISA=avx2 for AVX2's tiles."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from strand.kernels import cpu_linear_panels
from strand.kernels import cpu_linear_panels_bf16 as panels_bf16
from strand.kernels._cpu_build import KERNELS

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(KERNELS.module() is None,
                                reason=f"CPU kernels unavailable: {KERNELS.unavailable_reason()}")


def _module() -> Any:
    module = KERNELS.module()
    assert module is not None
    return module


def _case(rows: int, outputs: int, features: int, bias: bool, seed: int = 0
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed + rows * 10007 + outputs * 101 + features)
    x = torch.randn(rows, features, generator=g).bfloat16()
    w = (torch.randn(outputs, features, generator=g) / features ** 0.5).bfloat16()
    b = torch.randn(outputs, generator=g).bfloat16() if bias else None
    return x, w, b


def _want(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    out = x.float() @ w.float().T
    return out if b is None else out + b.float()


def _assert_matches(got: torch.Tensor, want: torch.Tensor) -> None:
    """One float32 sum (in another order) rounded once: within a bfloat16 step of the float32
    sum, and nearly every output the same bits as the sum rounded by torch (a sum that lies
    within float32 noise of a rounding boundary may round the other way)."""
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    torch.testing.assert_close(got.float(), want, rtol=2 ** -7, atol=1e-4)
    if want.numel():
        same = (got == want.bfloat16()).float().mean().item()
        assert same >= 0.98, f"only {same:.3f} of the outputs round as torch rounds the sum"


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 8, 17, 32, 64, 130, 512])
@pytest.mark.parametrize(("outputs", "features"), [(100, 64), (47, 75), (1001, 33), (49, 600),
                                                  (3, 1), (130, 2)])
@pytest.mark.parametrize("bias", [False, True])
def test_panels_match_float32_sums(rows: int, outputs: int, features: int, bias: bool) -> None:
    x, w, b = _case(rows, outputs, features, bias)
    panels = panels_bf16.pack(w)
    width = panels_bf16.width()  # 48 with AVX-512, 16 with AVX2
    assert panels.shape == ((outputs + width - 1) // width, (features + 1) // 2, width, 2)
    _assert_matches(panels_bf16.linear(x, panels, b, outputs), _want(x, w, b))


def test_a_float32_bias_is_added_as_it_is() -> None:
    x, w, _ = _case(9, 70, 40, False)
    b = torch.randn(70) * 3
    got = panels_bf16.linear(x, panels_bf16.pack(w), b, 70)
    _assert_matches(got, _want(x, w, None) + b)


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
@pytest.mark.parametrize("rows", [1, 8, 32, 40, 513])
def test_every_thread_count_gives_the_same_bits(threads: int, rows: int) -> None:
    # Each output is one sum along k in order, whichever thread takes its panel and rows.
    x, w, b = _case(rows, 100, 73, True, seed=3)
    panels = panels_bf16.pack(w)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = panels_bf16.linear(x, panels, b, 100)
        torch.set_num_threads(threads)
        many = panels_bf16.linear(x, panels, b, 100)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, many)


def test_the_layout_pairs_inputs_and_pads_with_zeros() -> None:
    width = panels_bf16.width()
    n, k = 2 * width + 2, 7  # two full panels and two columns of a third; an odd input
    _, w, _ = _case(1, n, k, False)
    panels = panels_bf16.pack(w)
    for p, i, j, t in ((0, 0, 0, 0), (0, 0, 0, 1), (1, 2, 5, 1), (2, 3, 1, 0), (2, 1, 0, 1)):
        assert torch.equal(panels[p, i, j, t], w[width * p + j, 2 * i + t])
    assert not panels[2, :, 2:].any()  # past the outputs
    assert not panels[:, 3, :, 1].any()  # past the odd input


def test_nothing_is_read_past_x_nor_stored_past_out() -> None:
    # An odd input's padded last pair must not take x's next value: the next row's first (an
    # infinity here: times the zero padding, NaN) or, after the last row, whatever follows x.
    width = panels_bf16.width()
    rows, n, k = 9, width + 5, 33
    x, w, _ = _case(rows, n, k, False)
    x_store = torch.full((rows * k + 64,), float("nan"), dtype=torch.bfloat16)
    x_store[:rows * k] = x.flatten()
    x_store[k] = float("inf")  # row 1, column 0
    xs = x_store[:rows * k].view(rows, k)
    out_store = torch.full((rows * n + 64,), 7.0, dtype=torch.bfloat16)
    out = out_store[:rows * n].view(rows, n)
    _module().linear_panels_bf16(out, xs, panels_bf16.pack(w))
    _assert_matches(out[[0, *range(2, rows)]], _want(xs, w, None)[[0, *range(2, rows)]])
    assert torch.equal(out_store[rows * n:], torch.full((64,), 7.0, dtype=torch.bfloat16))


def test_outputs_round_to_nearest_ties_to_even() -> None:
    # 1 + 2^-8 lies halfway between bfloat16 1 and 1 + 2^-7: to 1 (even); 1 + 3 * 2^-8 halfway
    # between 1 + 2^-7 (odd) and 1 + 2^-6: up.
    x = torch.ones(1, 2).bfloat16()
    w = torch.tensor([[1.0, 2 ** -8], [1.0, 3 * 2 ** -8]]).bfloat16()
    got = panels_bf16.linear(x, panels_bf16.pack(w), None, 2)
    assert got.tolist() == [[1.0, 1.0 + 2 ** -6]]


@pytest.mark.parametrize(("rows", "outputs"), [(0, 20), (5, 0)])
def test_empty_products_give_empty_outputs(rows: int, outputs: int) -> None:
    x, w, _ = _case(rows, outputs, 16, False)
    got = panels_bf16.linear(x, panels_bf16.pack(w), None, outputs)
    assert got.shape == (rows, outputs)


def test_three_d_inputs_keep_their_leading_dims() -> None:
    x, w, b = _case(12, 40, 16, True)
    panels = panels_bf16.pack(w)
    flat = panels_bf16.linear(x, panels, b, 40)
    assert torch.equal(panels_bf16.linear(x.view(3, 4, 16), panels, b, 40), flat.view(3, 4, 40))


def test_the_kernel_names_what_it_refuses() -> None:
    module = _module()
    width = panels_bf16.width()
    n = width + 2
    x, w, b = _case(4, n, 16, True)
    assert b is not None
    panels = panels_bf16.pack(w)
    bf = torch.bfloat16
    with pytest.raises(RuntimeError, match=rf"N in \({width}, {2 * width}\]"):
        module.linear_panels_bf16(torch.empty(4, width, dtype=bf), x, panels)
    with pytest.raises(RuntimeError, match=r"ceil\(K / 2\) = 9"):
        module.linear_panels_bf16(torch.empty(4, n, dtype=bf), torch.randn(4, 17).bfloat16(),
                                  panels)
    with pytest.raises(RuntimeError, match=rf"bias must be a contiguous bfloat16 or float32 \[{n}\]"):
        module.linear_panels_bf16(torch.empty(4, n, dtype=bf), x, panels, b[:-1])
    with pytest.raises(RuntimeError, match="bfloat16 x, panels and out, got Float"):
        module.linear_panels_bf16(torch.empty(4, n, dtype=bf), x.float(), panels)
    with pytest.raises(RuntimeError, match=rf"bfloat16 \[2, 8, {width}, 2\]"):
        module.pack_panels_bf16(torch.empty(1, 8, width, 2, dtype=bf), w)
    with pytest.raises(RuntimeError, match="contiguous bfloat16 weight"):
        module.pack_panels_bf16(torch.empty(2, 8, width, 2, dtype=bf), w.float())
    with pytest.raises(ValueError, match=rf"2-D bfloat16 CPU weight, got torch.float32 \({n}, 16\)"):
        panels_bf16.pack(w.float())
    with pytest.raises(ValueError, match=r"bfloat16 x \[\.\.\., 16 or 15\], got torch.float32"):
        panels_bf16.linear(x.float(), panels, b, n)
    with pytest.raises(ValueError, match=r"bfloat16 x \[\.\.\., 16 or 15\], got torch.bfloat16 "
                                         r"\(4, 14\)"):
        panels_bf16.linear(x[:, :14], panels, b, n)
    with pytest.raises(ValueError, match=rf"out_features {2 * width + 1} does not fit"):
        panels_bf16.linear(x, panels, None, 2 * width + 1)
    with pytest.raises(ValueError, match=rf"bias must be bfloat16 or float32 \[{n}\]"):
        panels_bf16.linear(x, panels, b.double(), n)
    with pytest.raises(ValueError, match="bfloat16 panels"):
        panels_bf16.linear(x, panels.float(), b, n)


def test_applies_to_bfloat16_weights_only() -> None:
    assert not panels_bf16.applies(torch.ones(4, 4))
    assert not panels_bf16.applies(torch.ones(4).bfloat16())
    assert panels_bf16.applies(torch.ones(4, 4).bfloat16()) == cpu_linear_panels.chosen()
    assert panels_bf16.is_panels(panels_bf16.pack(torch.ones(4, 4).bfloat16()))


_CHILD = """
import torch
from tests.kernels import test_linear_panels_bf16 as t
from strand.kernels import cpu_linear_panels_bf16 as p
assert not p.uses_dpbf16()
for rows in (1, 3, 8, 17, 130):
    for outputs, features in ((100, 64), (47, 75), (1001, 33)):
        x, w, b = t._case(rows, outputs, features, True)
        t._assert_matches(p.linear(x, p.pack(w), b, outputs), t._want(x, w, b))
print("ok")
"""


def test_the_widening_path_where_avx512_bf16_is_switched_off() -> None:
    # The C++ side reads STRAND_DISABLE_AVX512_BF16 once: a process of its own.
    if not panels_bf16.uses_dpbf16():
        pytest.skip("the widening path is the one this process runs")
    env = {**os.environ, "STRAND_DISABLE_AVX512_BF16": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_packing_that_releases_the_source_gives_the_same_panels(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A slice of panels at a time (made small here, to take several), the source's pages handed
    # back behind it: the panels are those of a packing in one go.
    width = panels_bf16.width()
    _, w, _ = _case(1, 5 * width + 3, 41, False)
    want = panels_bf16.pack(w)
    monkeypatch.setattr(cpu_linear_panels, "_RELEASE_EVERY", 2 * width * 41 * 2)
    assert torch.equal(panels_bf16.pack(w.clone(), release_source=True), want)
