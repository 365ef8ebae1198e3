"""The load log names what computes attention: the C++ CPU kernels or torch's SDPA path."""

from __future__ import annotations

import pytest
import torch

import strand.kernels.cpu_decode_attention as cpu_decode
from strand.engine_core.model_executor.attention.describe import describe_attention
from strand.engine_core.model_executor.attention.torch_ref import TorchAttentionBackend

CPU = torch.device("cpu")


def test_the_kernels_are_named_when_they_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_decode, "is_available", lambda: True)
    text = describe_attention(TorchAttentionBackend(), CPU, torch.float32)
    assert text.startswith("C++ CPU kernels")


def test_the_torch_path_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_decode, "is_available", lambda: False)
    monkeypatch.setattr(cpu_decode, "unavailable_reason", lambda: "no g++")
    assert (describe_attention(TorchAttentionBackend(), CPU, torch.float32)
            == "torch SDPA (C++ CPU kernels unavailable: no g++)")
    assert (describe_attention(TorchAttentionBackend(use_cpu_kernel=False), CPU, torch.float32)
            == "torch SDPA (C++ CPU kernels off)")
    assert (describe_attention(TorchAttentionBackend(), CPU, torch.float16)
            == "torch SDPA (no C++ CPU kernels for torch.float16)")
