"""The segmented LoRA op against the per-token reference, on fresh random inputs."""

from __future__ import annotations

import pytest
import torch

from strand.engine_core.lora.punica import add_lora, make_segments
from strand.kernels.lora_ref import add_lora_ref

CPU = torch.device("cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slots", [[0, 0, 1, -1, 2, 1, -1, 0], [1] * 5, [2, -1], [1, 1, 0]])
def test_segmented_matches_per_token_reference(dtype: torch.dtype, slots: list[int]) -> None:
    gen = torch.Generator().manual_seed(len(slots))
    n, d_in, d_out, rank, num_slots = len(slots), 24, 40, 8, 3
    x = torch.randn(n, d_in, generator=gen).to(dtype)
    a = torch.randn(num_slots, rank, d_in, generator=gen).to(dtype)
    b = torch.randn(num_slots, d_out, rank, generator=gen).to(dtype)
    base = torch.randn(n, d_out, generator=gen).to(dtype)
    token_slots = torch.tensor(slots, dtype=torch.int64)
    segs = make_segments(token_slots, CPU)
    assert segs is not None

    got = add_lora(base.clone(), x, a, b, segs)
    want = add_lora_ref(base.clone().float(), x, a, b, token_slots)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * 10)
    # Base-model rows are left bit for bit as they were; adapted ones moved.
    untouched = token_slots < 0
    assert torch.equal(got[untouched], base[untouched])
    assert not torch.equal(got[~untouched], base[~untouched])


def test_a_slot_the_layer_lacks_adds_nothing() -> None:
    x, base = torch.randn(3, 8), torch.randn(3, 6)
    a, b = torch.randn(2, 4, 8), torch.randn(2, 6, 4)
    segs = make_segments(torch.tensor([0, 1, 0]), CPU)
    assert segs is not None
    got = add_lora(base.clone(), x, a, b, segs, held=[False, True])
    assert torch.equal(got[[0, 2]], base[[0, 2]])
    torch.testing.assert_close(got[1], base[1] + b[1] @ (a[1] @ x[1]))


def test_segments_sort_adapted_rows_by_slot() -> None:
    segs = make_segments(torch.tensor([1, -1, 1, 0]), CPU)
    assert segs is not None and segs.rows is not None
    assert segs.rows.tolist() == [3, 0, 2] and segs.segments == [(0, 0, 1), (1, 1, 2)]
    whole = make_segments(torch.tensor([2, 2]), CPU)
    assert whole is not None and whole.rows is None and whole.segments == [(2, 0, 2)]
    assert make_segments(torch.tensor([-1, -1]), CPU) is None
