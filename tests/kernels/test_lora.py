"""Triton batched LoRA (strand/kernels/lora.py) against the per-token torch reference, on fresh random
inputs: mixed adapters, base-model rows, ranks padded to the slot width."""

from __future__ import annotations

import pytest
import torch

from strand.kernels.lora import add_lora_triton
from strand.kernels.lora_ref import add_lora_ref
from tests.kernels.conftest import DEVICE, DTYPES, assert_close

CASES = [  # (token slots, in_features, out_features, width)
    ([0, 0, 1, -1, 2, 1, -1, 0], 64, 96, 16),
    ([1, 1, 1], 100, 70, 24),  # sizes off the block multiples
    ([-1, -1], 32, 64, 8),  # nothing adapted
    ([2], 160, 130, 48),  # one decode token, width of 3 slices x rank 16
    ([0, -1, 1], 64, 40, 192),  # 3 slices x rank 64: the expand loops over the width
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("slots", "d_in", "d_out", "width"), CASES)
def test_kernel_matches_reference(slots: list[int], d_in: int, d_out: int, width: int,
                                  dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(d_in + len(slots))
    n = len(slots)
    x = torch.randn(n, d_in, generator=gen).to(dtype).to(DEVICE)
    a = (0.2 * torch.randn(3, width, d_in, generator=gen)).to(dtype).to(DEVICE)
    b = (0.2 * torch.randn(3, d_out, width, generator=gen)).to(dtype).to(DEVICE)
    base = torch.randn(n, d_out, generator=gen).to(dtype).to(DEVICE)
    token_slots = torch.tensor(slots, dtype=torch.int64, device=DEVICE)

    got = add_lora_triton(base.clone(), x, a, b, token_slots)
    want = add_lora_ref(base.clone().float(), x, a, b, token_slots)
    assert_close(got, want.to(dtype), dtype)
    # Base-model rows are never written: bit for bit what they were.
    untouched = token_slots < 0
    assert torch.equal(got[untouched], base[untouched])


def test_shape_mismatch_is_a_value_error() -> None:
    x = torch.zeros(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match=r"lora_b \[slots, 4, width\], got .* \[1, 5, 2\]"):
        add_lora_triton(torch.zeros(2, 4, device=DEVICE), x, torch.zeros(1, 2, 8, device=DEVICE),
                        torch.zeros(1, 5, 2, device=DEVICE),
                        torch.zeros(2, dtype=torch.int64, device=DEVICE))
