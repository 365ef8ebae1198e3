"""Which attention backend a name and a device get."""

from __future__ import annotations

import pytest
import torch

from strand.engine_core.model_executor.attention.selector import (
    get_attention_backend,
    register_attention_backend,
)
from strand.engine_core.model_executor.attention.torch_ref import TorchAttentionBackend

CPU = torch.device("cpu")


def test_auto_on_cpu_is_the_torch_backend() -> None:
    assert isinstance(get_attention_backend(None, CPU, 16), TorchAttentionBackend)


def test_unknown_name_lists_the_available_backends() -> None:
    with pytest.raises(ValueError, match="attention_backend must be one of .*torch.*got 'fast'"):
        get_attention_backend("fast", CPU, 16)


def test_registered_backend_is_built_with_the_block_size() -> None:
    seen = []

    def factory(block_size: int) -> TorchAttentionBackend:
        seen.append(block_size)
        return TorchAttentionBackend()

    register_attention_backend("mine", factory)
    assert isinstance(get_attention_backend("mine", CPU, 32), TorchAttentionBackend)
    assert seen == [32]
