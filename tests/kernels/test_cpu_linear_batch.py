"""The decode-batch linear kernel (strand/kernels/csrc/linear_batch.cpp): float32 and bfloat16 sums
against float64 ones, over row counts that fill whole tiles and leave partial ones, weights whose
rows end in a partial group, features that end in a partial vector; and the layer that takes it
on an AVX2-only CPU. Runs under any ISA (the kernel is built for the level in force)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from strand.engine_core.model_executor.layers.linear import Linear
from strand.kernels import cpu_linear, cpu_linear_batch, cpu_linear_panels
from strand.kernels._cpu_build import KERNELS

pytestmark = pytest.mark.skipif(KERNELS.module() is None,
                                reason=f"CPU kernels unavailable: {KERNELS.unavailable_reason()}")


def _want(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ w.double().T
    return out if b is None else out + b.double()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [5, 6, 7, 8, 13, 32, 64])
@pytest.mark.parametrize(("outputs", "features"), [(37, 75), (48, 64), (7, 600), (1001, 24),
                                                  (19, 777)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_batch_matches_float64_sums(dtype: torch.dtype, rows: int, outputs: int,
                                           features: int, bias: bool) -> None:
    g = torch.Generator().manual_seed(rows * 1000 + outputs + features)
    x = torch.randn(rows, features, generator=g).to(dtype)
    w = (torch.randn(outputs, features, generator=g) / features ** 0.5).to(dtype)
    b = torch.randn(outputs, generator=g).to(dtype) if bias else None
    got = cpu_linear_batch.linear_batch(x, w, b)
    assert got.shape == (rows, outputs) and got.dtype == dtype
    want = _want(x, w, b)
    if dtype == torch.float32:
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    else:  # float32 sums, one rounding: within half a bfloat16 step of the exact sum (plus slack)
        err = (got.double() - want).abs()
        assert bool((err <= want.abs() * 2 ** -8 + 1e-5).all()), float(err.max())


def test_linear_batch_is_exactly_the_float32_sums_rounded_once() -> None:
    # bfloat16 out = the float32 result rounded to nearest-even (what torch's .bfloat16() does).
    g = torch.Generator().manual_seed(7)
    x = torch.randn(9, 40, generator=g).bfloat16()
    w = torch.randn(21, 40, generator=g).bfloat16()
    wide = cpu_linear_batch.linear_batch(x.float(), w.float(), None)
    narrow = cpu_linear_batch.linear_batch(x, w, None)
    assert torch.equal(narrow, wide.bfloat16())


def test_linear_batch_names_what_it_refuses() -> None:
    w = torch.randn(8, 16)
    with pytest.raises(ValueError, match="x has 12 features, the weight takes 16"):
        cpu_linear_batch.linear_batch(torch.randn(6, 12), w, None)
    with pytest.raises(ValueError, match="one dtype"):
        cpu_linear_batch.linear_batch(torch.randn(6, 16).bfloat16(), w, None)
    with pytest.raises(ValueError, match=r"bias must have shape \(8,\)"):
        cpu_linear_batch.linear_batch(torch.randn(6, 16), w, torch.randn(9))
    with pytest.raises(ValueError, match=r"x \[M, in\]"):
        cpu_linear_batch.linear_batch(torch.randn(6, 16, 1), w, None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [4, 5, 32, 64, 65])
@pytest.mark.parametrize("panels", [True, False])
def test_the_layer_takes_it_for_decode_batches_where_chosen(
        monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype, rows: int, panels: bool) -> None:
    monkeypatch.setattr(cpu_linear_batch, "chosen", lambda: True)  # as on an AVX2-only CPU
    # Decode batches go to the panels where they are chosen (STRAND_LINEAR_PANELS=0: not).
    monkeypatch.setattr(cpu_linear_panels, "chosen", lambda: panels)
    layer = Linear(75, 41, bias=True).to(dtype)
    x = torch.randn(rows, 75).to(dtype)
    calls: list[int] = []
    real = cpu_linear_batch.linear_batch

    def counting(x: torch.Tensor, w: torch.Tensor, b: Any) -> torch.Tensor:
        calls.append(x.shape[0])
        return real(x, w, b)

    monkeypatch.setattr(cpu_linear_batch, "linear_batch", counting)
    with torch.inference_mode():
        want = _want(x, layer.weight, layer.bias)
        layer.pack(keep_dense=False)
        got = layer(x)
    taken = (cpu_linear.SMALL_M < rows <= cpu_linear_batch.BATCH_M and layer.small_m
             and not panels)
    assert calls == ([rows] if taken else [])
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * 4)


def test_it_is_chosen_at_the_avx2_level_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from strand.platform.cpu_isa import probe

    monkeypatch.delenv("STRAND_LINEAR_BATCH", raising=False)
    monkeypatch.delenv("STRAND_DISABLE_CPU_KERNELS", raising=False)
    monkeypatch.delenv("STRAND_CPU_GEMM", raising=False)
    cpu_linear_batch.chosen.cache_clear()
    try:
        assert cpu_linear_batch.chosen() == (probe().level == "avx2")
        cpu_linear_batch.chosen.cache_clear()
        monkeypatch.setenv("STRAND_LINEAR_BATCH", "0")
        assert not cpu_linear_batch.chosen()
    finally:
        cpu_linear_batch.chosen.cache_clear()
