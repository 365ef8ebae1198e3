"""Triton RMSNorm (with and without the fused residual add) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from strand.kernels.rms_norm import rms_norm
from strand.kernels.rms_norm_ref import rms_norm_ref
from tests.kernels.conftest import DEVICE, DTYPES, assert_close

SHAPES = [(1, 32), (7, 64), (5, 100), (3, 4, 256)]


def inputs(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    residual = torch.randn(shape, generator=gen).to(dtype).to(DEVICE)
    weight = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to(dtype).to(DEVICE)
    return x, residual, weight


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_kernel_matches_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x, _, weight = inputs(shape, dtype, seed=len(shape) + shape[-1])
    out = rms_norm(x, weight, 1e-6)
    assert out.shape == x.shape and out.dtype == dtype
    assert_close(out, rms_norm_ref(x, weight, 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_fused_residual_matches_reference(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    x, residual, weight = inputs(shape, dtype, seed=shape[-1])
    out, new_residual = rms_norm(x, weight, 1e-5, residual=residual)
    expected_out, expected_residual = rms_norm_ref(x, weight, 1e-5, residual=residual)
    assert_close(out, expected_out, dtype)
    torch.testing.assert_close(new_residual, expected_residual, atol=0, rtol=0)


def test_inputs_are_not_modified() -> None:
    x, residual, weight = inputs((4, 64), torch.float32, seed=1)
    x_before, residual_before = x.clone(), residual.clone()
    rms_norm(x, weight, 1e-6, residual=residual)
    assert torch.equal(x, x_before) and torch.equal(residual, residual_before)


def test_fp32_weight_on_fp16_input_gives_fp32_like_torch() -> None:
    x, _, _ = inputs((3, 64), torch.float16, seed=2)
    weight = torch.rand(64, device=DEVICE)
    out = rms_norm(x, weight, 1e-6)
    assert out.dtype == torch.float32
    assert_close(out, rms_norm_ref(x, weight, 1e-6), torch.float16)


def test_reference_matches_hf_llama_rms_norm() -> None:
    modeling_llama = pytest.importorskip(
        "transformers.models.llama.modeling_llama", reason="transformers is the test oracle")
    x, _, weight = inputs((5, 64), torch.float16, seed=3)
    hf = modeling_llama.LlamaRMSNorm(64, eps=1e-6).to(DEVICE, torch.float16)
    with torch.no_grad():
        hf.weight.copy_(weight)
        expected = hf(x)
    torch.testing.assert_close(rms_norm_ref(x, weight, 1e-6), expected, atol=0, rtol=0)


def test_unit_weight_output_has_unit_rms() -> None:
    x = torch.randn(6, 128, device=DEVICE) * 7
    out = rms_norm(x, torch.ones(128, device=DEVICE), 1e-12)
    rms = out.pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones(6, device=DEVICE), atol=1e-5, rtol=1e-5)


def test_weight_of_the_wrong_size_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"weight must be \[hidden=64\]"):
        rms_norm(torch.zeros(2, 64, device=DEVICE), torch.ones(32, device=DEVICE), 1e-6)


def test_non_positive_eps_is_rejected() -> None:
    with pytest.raises(ValueError, match="eps must be > 0"):
        rms_norm(torch.zeros(2, 64, device=DEVICE), torch.ones(64, device=DEVICE), 0.0)
