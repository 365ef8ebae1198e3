"""The grouped LoRA op against the per-token reference, on fresh random inputs."""

from __future__ import annotations

import pytest
import torch

from engine_core.lora.punica import add_lora, make_groups
from kernels.lora_ref import add_lora_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("slots", [[0, 0, 1, -1, 2, 1, -1, 0], [1] * 5, [-1] * 4, [2, -1]])
def test_grouped_matches_per_token_reference(dtype: torch.dtype, slots: list[int]) -> None:
    gen = torch.Generator().manual_seed(len(slots))
    n, d_in, d_out, rank, num_slots = len(slots), 24, 40, 8, 3
    x = torch.randn(n, d_in, generator=gen).to(dtype)
    a = torch.randn(num_slots, rank, d_in, generator=gen).to(dtype)
    b = torch.randn(num_slots, d_out, rank, generator=gen).to(dtype)
    base = torch.randn(n, d_out, generator=gen).to(dtype)
    token_slots = torch.tensor(slots, dtype=torch.int64)

    got = add_lora(base.clone(), x, a, b, make_groups(token_slots, torch.device("cpu")))
    want = add_lora_ref(base.clone().float(), x, a, b, token_slots)
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * 10)
    # Base-model rows are left bit for bit as they were.
    untouched = token_slots < 0
    assert torch.equal(got[untouched], base[untouched])
    if (~untouched).any():
        assert not torch.equal(got[~untouched], base[~untouched])


def test_groups_cover_each_slot_once() -> None:
    groups = make_groups(torch.tensor([1, -1, 1, 0]), torch.device("cpu"))
    assert [(g.slot, None if g.rows is None else g.rows.tolist()) for g in groups] == [
        (0, [3]), (1, [0, 2])]
    whole = make_groups(torch.tensor([2, 2]), torch.device("cpu"))
    assert [(g.slot, g.rows) for g in whole] == [(2, None)]  # no gather for a one-adapter batch
