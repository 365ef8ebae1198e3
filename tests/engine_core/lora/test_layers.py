"""LoRALayerSlots on a fused Linear: slices land on their own output columns, base-model rows
stay untouched, and the CUDA path (Triton, run here by the interpreter) adds what the CPU path
(segmented GEMMs) adds."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import strand.engine_core.lora.layers as layers
from strand.engine_core.lora.layers import LoRABatch, LoRALayerSlots
from strand.engine_core.lora.punica import make_segments

# On a GPU the Triton path runs for real; on a CPU through the interpreter (tests/conftest.py).
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _layer(batch: LoRABatch) -> tuple[nn.Linear, LoRALayerSlots]:
    torch.manual_seed(0)
    linear = nn.Linear(16, 12, bias=False, device=DEVICE)  # a fused q|k|v of 8 + 2 + 2
    slots = LoRALayerSlots(linear, [8, 2, 2], batch, max_loras=2, max_rank=4,
                           device=DEVICE, dtype=torch.float32)
    return linear, slots


def _set_batch(batch: LoRABatch, token_slots: list[int]) -> None:
    slots = torch.tensor(token_slots, dtype=torch.int64, device=DEVICE)
    batch.segments = make_segments(slots, DEVICE)
    batch.token_slots = slots


def test_slices_hit_their_own_columns_and_base_rows_stay() -> None:
    batch = LoRABatch()
    linear, target = _layer(batch)
    a, b = torch.randn(3, 16, device=DEVICE), torch.randn(2, 3, device=DEVICE)  # rank 3 (< max_rank 4) on the k slice
    target.set(1, 1, a, b)
    x = torch.randn(3, 16, device=DEVICE)
    base = linear(x)
    _set_batch(batch, [1, -1, 0])  # slot 0 holds nothing for this layer
    out = linear(x)
    torch.testing.assert_close(out[0, 8:10], base[0, 8:10] + (x[0] @ a.t()) @ b.t())
    assert torch.equal(out[0, :8], base[0, :8]) and torch.equal(out[0, 10:], base[0, 10:])
    assert torch.equal(out[1:], base[1:])
    target.clear(1)
    assert torch.equal(linear(x), base)


def test_triton_path_adds_what_the_segmented_path_adds(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("triton")
    batch = LoRABatch()
    linear, target = _layer(batch)
    for slot in (0, 1):
        for index, size in enumerate([8, 2, 2]):
            target.set(slot, index, torch.randn(4, 16, device=DEVICE), torch.randn(size, 4, device=DEVICE))
    x = torch.randn(5, 16, device=DEVICE)
    _set_batch(batch, [0, 1, -1, 1, 0])
    monkeypatch.setattr(layers, "runs_triton", lambda t: False)
    segmented = linear(x)
    monkeypatch.setattr(layers, "runs_triton", lambda t: True)
    per_token = linear(x)
    torch.testing.assert_close(per_token, segmented, rtol=1e-4, atol=1e-4)
    assert torch.equal(per_token[2], segmented[2])
