"""available_backends(): what the selector may choose on this machine, best first."""

from __future__ import annotations

import pytest
import torch

from strand.kernels import _triton
from strand.kernels._triton import available_backends


def test_torch_is_always_available_and_last() -> None:
    assert available_backends()[-1] == "torch"


def test_cpu_without_interpreter_offers_only_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert available_backends() == ["torch"]


def test_cpu_with_interpreter_offers_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert available_backends() == ["triton", "torch"]


def test_flash_attn_needs_cuda_as_well_as_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_triton, "flash_attn_importable", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "flash_attn" not in available_backends()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert available_backends() == ["flash_attn", "triton", "torch"]
