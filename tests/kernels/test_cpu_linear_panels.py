"""Strand's float32 GEMM on panel-packed weights (strand/kernels/csrc/linear_panels.cpp) against
float64 sums: row counts that fill whole 8-row tiles and leave partial ones, outputs that end in
a partial panel, bias or none, one thread and several (rows split as well as panels); its
argument checks; and where the layers take it. Runs under any ISA (the kernel is built for the
level in force; it is chosen at the avx2 and avx512 levels)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from strand.engine_core.model_executor.layers.linear import Linear
from strand.kernels import cpu_linear, cpu_linear_panels
from strand.kernels._cpu_build import KERNELS

pytestmark = pytest.mark.skipif(KERNELS.module() is None,
                                reason=f"CPU kernels unavailable: {KERNELS.unavailable_reason()}")


def _module() -> Any:
    module = KERNELS.module()
    assert module is not None
    return module


@pytest.fixture
def fresh_choice() -> Iterator[None]:
    # chosen() is cached per process; a test that changes the environment runs it again and
    # leaves it as it found it.
    cpu_linear_panels.chosen.cache_clear()
    yield
    cpu_linear_panels.chosen.cache_clear()


def _case(rows: int, outputs: int, features: int, bias: bool, seed: int = 0
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed + rows * 10007 + outputs * 101 + features)
    x = torch.randn(rows, features, generator=g)
    w = torch.randn(outputs, features, generator=g) / features ** 0.5
    b = torch.randn(outputs, generator=g) if bias else None
    return x, w, b


def _want(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ w.double().T
    return out if b is None else out + b.double()


@pytest.mark.parametrize("rows", [1, 5, 7, 8, 9, 16, 31, 32, 33, 64, 100])
@pytest.mark.parametrize(("outputs", "features"), [(48, 64), (47, 75), (49, 1), (1001, 24),
                                                  (96, 600), (3, 16)])
@pytest.mark.parametrize("bias", [False, True])
def test_panels_match_float64_sums(rows: int, outputs: int, features: int, bias: bool) -> None:
    x, w, b = _case(rows, outputs, features, bias)
    panels = cpu_linear_panels.pack(w)
    width = _module().linear_panel_width()  # 48 with AVX-512, 16 with AVX2
    assert panels.shape == ((outputs + width - 1) // width, features, width)
    got = cpu_linear_panels.linear(x, panels, b, outputs)
    assert got.shape == (rows, outputs) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), _want(x, w, b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2, 3, 7])
@pytest.mark.parametrize("rows", [8, 32, 40, 513])
def test_every_thread_count_gives_the_same_bits(threads: int, rows: int) -> None:
    # Each output is one sum along k in order, whichever thread takes its panel and rows: the
    # split (panels, and rows where panels are few) cannot change a bit.
    x, w, b = _case(rows, 100, 72, True, seed=3)
    panels = cpu_linear_panels.pack(w)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_linear_panels.linear(x, panels, b, 100)
        torch.set_num_threads(threads)
        many = cpu_linear_panels.linear(x, panels, b, 100)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, many)


def test_the_padding_of_the_last_panel_is_zero_and_never_stored() -> None:
    width = _module().linear_panel_width()
    n = 2 * width + 2  # two full panels and two columns of a third
    x, w, _ = _case(9, n, 20, False)
    panels = cpu_linear_panels.pack(w)
    assert torch.equal(panels[2, :, 2:], torch.zeros(20, width - 2))
    assert torch.equal(panels[1, 5], w[width:2 * width, 5])
    assert torch.equal(panels[2, 5, :2], w[2 * width:, 5])
    out = torch.full((9, n), float("nan"))
    _module().linear_panels(out, x, panels)
    torch.testing.assert_close(out.double(), _want(x, w, None), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("rows", "outputs"), [(0, 20), (5, 0)])
def test_empty_products_give_empty_outputs(rows: int, outputs: int) -> None:
    x, w, _ = _case(rows, outputs, 16, False)
    got = cpu_linear_panels.linear(x, cpu_linear_panels.pack(w), None, outputs)
    assert got.shape == (rows, outputs)


def test_three_d_inputs_keep_their_leading_dims() -> None:
    x, w, b = _case(12, 40, 16, True)
    panels = cpu_linear_panels.pack(w)
    flat = cpu_linear_panels.linear(x, panels, b, 40)
    assert torch.equal(cpu_linear_panels.linear(x.view(3, 4, 16), panels, b, 40), flat.view(3, 4, 40))


def test_the_kernel_names_what_it_refuses() -> None:
    module = _module()
    width = module.linear_panel_width()
    n = width + 2
    x, w, b = _case(4, n, 16, True)
    panels = cpu_linear_panels.pack(w)
    with pytest.raises(RuntimeError, match=rf"N in \({width}, {2 * width}\]"):
        module.linear_panels(torch.empty(4, width), x, panels)
    with pytest.raises(RuntimeError, match="panels' K the same as x's"):
        module.linear_panels(torch.empty(4, n), torch.randn(4, 17), panels)
    with pytest.raises(RuntimeError, match=rf"bias must be a contiguous float32 \[{n}\]"):
        module.linear_panels(torch.empty(4, n), x, panels, torch.zeros(n - 1))
    with pytest.raises(RuntimeError, match="float32"):
        module.linear_panels(torch.empty(4, n), x.double(), panels)
    with pytest.raises(RuntimeError,
                       match=rf"panels must be a contiguous float32 \[2, 16, {width}\]"):
        module.pack_panels(torch.empty(1, 16, width), w)
    with pytest.raises(ValueError, match="2-D float32 CPU weight"):
        cpu_linear_panels.pack(w.bfloat16())
    with pytest.raises(ValueError, match=r"float32 x \[\.\.\., 16\]"):
        cpu_linear_panels.linear(torch.randn(4, 15), panels, b, n)


def test_chosen_at_the_avx2_and_avx512_levels_unless_switched_off(
        monkeypatch: pytest.MonkeyPatch, fresh_choice: None) -> None:
    from strand.platform.cpu_isa import probe

    for name in ("STRAND_LINEAR_PANELS", "STRAND_DISABLE_CPU_KERNELS", "STRAND_CPU_GEMM"):
        monkeypatch.delenv(name, raising=False)
    assert cpu_linear_panels.chosen() == (probe().level in ("avx2", "avx512"))
    for name, value in (("STRAND_LINEAR_PANELS", "0"), ("STRAND_CPU_GEMM", "torch"),
                        ("STRAND_DISABLE_CPU_KERNELS", "1")):
        with monkeypatch.context() as env:
            env.setenv(name, value)
            cpu_linear_panels.chosen.cache_clear()
            assert not cpu_linear_panels.chosen(), name
    cpu_linear_panels.chosen.cache_clear()
    assert not cpu_linear_panels.applies(torch.ones(4, 4).bfloat16())


def test_a_layer_packs_panels_where_chosen_and_onednns_copy_where_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    if cpu_linear.unavailable_reason(torch.float32) is not None:
        pytest.skip(f"oneDNN linear unavailable: {cpu_linear.unavailable_reason(torch.float32)}")
    x = torch.randn(20, 64)
    for panels in (True, False):
        monkeypatch.setattr(cpu_linear_panels, "chosen", lambda panels=panels: panels)
        layer = Linear(64, 100, bias=True)
        with torch.inference_mode():
            want = torch.nn.functional.linear(x, layer.weight, layer.bias).double()
            assert layer.pack(keep_dense=False)
            assert layer.packed is not None
            assert cpu_linear_panels.is_panels(layer.packed) == panels
            torch.testing.assert_close(layer(x).double(), want, rtol=1e-5, atol=1e-5)
