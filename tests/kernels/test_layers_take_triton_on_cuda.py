"""The model's RMSNorm and rotary layers on their Triton path (taken on CUDA; on a CPU through the
interpreter) give what their torch path gives."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from strand.engine_core.model_executor.layers.rms_norm import RMSNorm
from strand.engine_core.model_executor.layers.rotary_embedding import RotaryEmbedding
from strand.kernels import _triton, cpu_elementwise
from strand.kernels.rms_norm_ref import rms_norm_ref

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _layers_take(monkeypatch: pytest.MonkeyPatch, triton: bool) -> list[str]:
    """Route the layers to Triton (or to torch); returns the kernels launched."""
    launched: list[str] = []
    monkeypatch.setattr(cpu_elementwise, "applies", lambda *tensors: False)
    monkeypatch.setattr(_triton, "runs_triton", lambda t: triton)
    # The layers import their Triton kernels when they first take them (no Triton import on a
    # CPU): the kernels' own modules are where a call is seen.
    for module, name, label in (("strand.kernels.rms_norm", "rms_norm", "triton_rms_norm"),
                                ("strand.kernels.rotary", "apply_rotary", "apply_rotary")):
        real = getattr(__import__(module, fromlist=[name]), name)

        def recording(*args: object, _real=real, _name=label, **kwargs: object) -> object:  # type: ignore[no-untyped-def]
            launched.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(f"{module}.{name}", recording)
    return launched


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rms_norm_layer_on_triton(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    launched = _layers_take(monkeypatch, triton=True)
    g = torch.Generator().manual_seed(0)
    layer = RMSNorm(72, 1e-6).to(DEVICE, dtype)
    layer.weight.data = (1 + 0.1 * torch.randn(72, generator=g)).to(DEVICE, dtype)
    x, residual = (torch.randn(5, 72, generator=g).to(DEVICE, dtype) for _ in range(2))
    with torch.inference_mode():
        out = layer(x)
        summed_out, summed = layer(x, residual)
    assert launched == ["triton_rms_norm", "triton_rms_norm"]
    tol: dict[str, Any] = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-3, "rtol": 2e-3}
    torch.testing.assert_close(out, rms_norm_ref(x, layer.weight, 1e-6), **tol)
    ref_out, ref_summed = rms_norm_ref(x, layer.weight, 1e-6, residual)
    torch.testing.assert_close(summed, ref_summed, **tol)
    torch.testing.assert_close(summed_out, ref_out, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_rotary_layer_on_triton(monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    rotary = RotaryEmbedding(32, 64, 10000.0, None)
    rotary.build_cache(DEVICE)
    positions = torch.tensor([0, 3, 63, 7], device=DEVICE)
    q = torch.randn(4, 6, 32, generator=g).to(DEVICE, dtype)
    k = torch.randn(4, 2, 32, generator=g).to(DEVICE, dtype)
    _layers_take(monkeypatch, triton=False)
    with torch.inference_mode():
        ref_q, ref_k = rotary(positions, q.clone(), k.clone())
    monkeypatch.undo()
    launched = _layers_take(monkeypatch, triton=True)
    with torch.inference_mode():
        got_q, got_k = rotary(positions, q.clone(), k.clone())
    assert launched == ["apply_rotary"]
    tol: dict[str, Any] = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-3, "rtol": 2e-3}
    torch.testing.assert_close(got_q, ref_q, **tol)
    torch.testing.assert_close(got_k, ref_k, **tol)
