"""oneDNN linear on CPU against F.linear, and the switches that turn it off."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from strand.kernels import cpu_linear, cpu_linear_panels


@pytest.fixture
def fresh_check() -> Iterator[None]:
    # The availability check is cached per process; a test that changes the environment needs
    # it run again, and must leave it as it found it.
    cpu_linear.unavailable_reason.cache_clear()
    cpu_linear_panels.chosen.cache_clear()
    yield
    cpu_linear.unavailable_reason.cache_clear()
    cpu_linear_panels.chosen.cache_clear()


def test_onednn_is_used_where_torch_has_it() -> None:
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    assert cpu_linear.unavailable_reason() is None


@pytest.mark.parametrize("shape", [(1, 16, 8), (64, 512, 1024), (37, 72, 300), (300, 64, 5)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_float32_matches_f_linear(shape: tuple[int, int, int], with_bias: bool) -> None:
    m, k, n = shape
    g = torch.Generator().manual_seed(m * k + n)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if with_bias else None
    with torch.inference_mode():
        got = cpu_linear.linear(x, w, b)
    assert got.shape == (m, n) and got.dtype == torch.float32
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-4)


def test_a_strided_input_gives_the_same_product() -> None:
    g = torch.Generator().manual_seed(3)
    wide, w = torch.randn(16, 256, generator=g), torch.randn(40, 128, generator=g)
    x = wide[:, ::2]  # every other column: not contiguous
    with torch.inference_mode():
        torch.testing.assert_close(cpu_linear.linear(x, w, None), F.linear(x, w),
                                   rtol=1e-5, atol=1e-4)


def test_bfloat16_matches_f_linear() -> None:
    # Through oneDNN where the CPU has its bfloat16 kernels, through torch's path elsewhere
    # (AVX2-only): the same product either way, never an error.
    g = torch.Generator().manual_seed(4)
    x = torch.randn(8, 64, generator=g).bfloat16()
    w = torch.randn(32, 64, generator=g).bfloat16()
    with torch.inference_mode():
        got = cpu_linear.linear(x, w, None)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), F.linear(x, w).float(), rtol=2e-2, atol=2e-2)


def test_strand_cpu_gemm_torch_keeps_the_default_path(monkeypatch: pytest.MonkeyPatch,
                                                      fresh_check: None) -> None:
    monkeypatch.setenv("STRAND_CPU_GEMM", "torch")
    assert cpu_linear.unavailable_reason() == "STRAND_CPU_GEMM=torch"
    called = []
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise",
                        lambda *a: called.append(a), raising=False)
    x, w = torch.ones(2, 4), torch.ones(3, 4)
    with torch.inference_mode():
        assert torch.equal(cpu_linear.linear(x, w, None), torch.full((2, 3), 4.0))
    assert not called


def test_disable_cpu_kernels_turns_it_off(monkeypatch: pytest.MonkeyPatch,
                                          fresh_check: None) -> None:
    monkeypatch.setenv("STRAND_DISABLE_CPU_KERNELS", "1")
    assert "STRAND_DISABLE_CPU_KERNELS" in (cpu_linear.unavailable_reason() or "")


def test_with_gradients_on_it_stays_differentiable() -> None:
    # oneDNN's op has no backward; outside inference the layer must keep autograd working.
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(5, 8)
    cpu_linear.linear(x, w, None).sum().backward()
    assert x.grad is not None and x.grad.shape == (4, 8)


@pytest.mark.parametrize("shape", [(1, 16, 8), (64, 512, 1024), (37, 72, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_packed_weight_gives_the_plain_product(shape: tuple[int, int, int],
                                                 dtype: torch.dtype) -> None:
    if cpu_linear.unavailable_reason(dtype) is not None:
        pytest.skip(f"oneDNN linear unavailable: {cpu_linear.unavailable_reason(dtype)}")
    m, k, n = shape
    g = torch.Generator().manual_seed(m + k + n)
    x, w = torch.randn(m, k, generator=g).to(dtype), torch.randn(n, k, generator=g).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    packed = cpu_linear.pack_weight(w)
    assert packed is not None
    with torch.inference_mode():
        got = cpu_linear.linear_packed(x, packed, b, n)
        rtol, atol = (1e-5, 1e-4) if dtype == torch.float32 else (2e-2, 5e-2)
        torch.testing.assert_close(got.float(), F.linear(x, w, b).float(), rtol=rtol, atol=atol)
        three_d = cpu_linear.linear_packed(x.view(1, m, k), packed, b, n)
    assert torch.equal(three_d.view(m, n), got)


def test_nothing_is_packed_where_onednn_does_not_apply(monkeypatch: pytest.MonkeyPatch,
                                                       fresh_check: None) -> None:
    assert cpu_linear.pack_weight(torch.ones(4, 4, dtype=torch.float64)) is None
    monkeypatch.setenv("STRAND_CPU_GEMM", "torch")
    cpu_linear.unavailable_reason.cache_clear()
    cpu_linear_panels.chosen.cache_clear()
    assert cpu_linear.pack_weight(torch.ones(4, 4)) is None


def test_bfloat16_takes_torchs_path_where_the_cpu_lacks_onednns_bf16_kernels(
        monkeypatch: pytest.MonkeyPatch, fresh_check: None) -> None:
    # On an AVX2-only CPU oneDNN's bfloat16 reorder raises; the layer must not get there.
    from strand.platform import cpu_isa

    avx2 = cpu_isa.CpuIsa(machine="x86_64", detected="avx2", level="avx2",
                          flags=frozenset({"avx2"}))
    monkeypatch.setattr(cpu_linear, "probe", lambda: avx2)
    assert "avx2" in (cpu_linear.unavailable_reason(torch.bfloat16) or "")
    assert cpu_linear.unavailable_reason(torch.float32) is None
    w = torch.randn(32, 64).bfloat16()
    # bfloat16 panels aside (they take any CPU level), no packed copy: not oneDNN's.
    monkeypatch.setattr(cpu_linear.cpu_linear_panels_bf16, "applies", lambda weight: False)
    assert cpu_linear.pack_weight(w) is None
    called = []
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise",
                        lambda *a: called.append(a), raising=False)
    x = torch.randn(8, 64).bfloat16()
    with torch.inference_mode():
        got = cpu_linear.linear(x, w, None)
    assert not called and torch.equal(got, F.linear(x, w))
