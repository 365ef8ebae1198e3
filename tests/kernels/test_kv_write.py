"""Triton KV write against the pure-torch scatter."""

from __future__ import annotations

import pytest
import torch

from strand.kernels.kv_write import write_kv
from strand.kernels.kv_write_ref import write_kv_ref
from tests.kernels.conftest import DEVICE, DTYPES


def random_cache(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype) -> torch.Tensor:
    shape = (2, num_blocks, block_size, num_kv_heads, head_dim)
    return torch.randn(shape, device=DEVICE).to(dtype)


def random_slots(num_tokens: int, num_blocks: int, block_size: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    return slots.to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("num_tokens", "num_kv_heads", "head_dim", "block_size"),
    [(1, 1, 32, 16), (7, 2, 64, 16), (40, 4, 32, 32), (13, 3, 40, 48)],
)
def test_kernel_matches_reference(
    num_tokens: int, num_kv_heads: int, head_dim: int, block_size: int, dtype: torch.dtype
) -> None:
    key = torch.randn(num_tokens, num_kv_heads, head_dim, device=DEVICE).to(dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_dim, device=DEVICE).to(dtype)
    cache = random_cache(6, block_size, num_kv_heads, head_dim, dtype)
    slots = random_slots(num_tokens, 6, block_size, seed=num_tokens)
    expected = cache.clone()
    write_kv_ref(key, value, expected, slots)
    write_kv(key, value, cache, slots)
    assert torch.equal(cache, expected)


def test_each_token_lands_in_its_slot() -> None:
    key = torch.randn(3, 2, 32, device=DEVICE)
    value = torch.randn(3, 2, 32, device=DEVICE)
    cache = torch.zeros(2, 4, 16, 2, 32, device=DEVICE)
    write_kv(key, value, cache, torch.tensor([17, 0, 63], device=DEVICE))
    assert torch.equal(cache[0, 1, 1], key[0]) and torch.equal(cache[1, 1, 1], value[0])
    assert torch.equal(cache[0, 0, 0], key[1]) and torch.equal(cache[1, 0, 0], value[1])
    assert torch.equal(cache[0, 3, 15], key[2]) and torch.equal(cache[1, 3, 15], value[2])
    assert int((cache != 0).any(dim=(-1, -2)).sum()) == 6


def test_slot_minus_one_is_skipped() -> None:
    key = torch.randn(4, 2, 32, device=DEVICE)
    value = torch.randn(4, 2, 32, device=DEVICE)
    cache = random_cache(3, 16, 2, 32, torch.float32)
    before = cache.clone()
    write_kv(key, value, cache, torch.tensor([5, -1, -1, 20], device=DEVICE))
    expected = before.clone()
    write_kv_ref(key, value, expected, torch.tensor([5, -1, -1, 20]))
    assert torch.equal(cache, expected)
    assert torch.equal(cache[:, 2], before[:, 2])  # untouched block stays as it was


def test_strided_views_of_a_fused_projection_are_written() -> None:
    # [num_tokens, q_heads + 2 * kv_heads, head_dim]: k and v are non-contiguous slices.
    qkv = torch.randn(5, 8, 32, device=DEVICE)
    key, value = qkv[:, 4:6], qkv[:, 6:8]
    cache = torch.zeros(2, 2, 16, 2, 32, device=DEVICE)
    slots = torch.tensor([0, 3, 16, 31, 7], device=DEVICE)
    expected = cache.clone()
    write_kv_ref(key, value, expected, slots)
    write_kv(key, value, cache, slots)
    assert torch.equal(cache, expected)


def test_key_shape_must_match_the_cache() -> None:
    cache = torch.zeros(2, 2, 16, 2, 32, device=DEVICE)
    with pytest.raises(ValueError, match="num_kv_heads=2"):
        write_kv(torch.zeros(3, 4, 32, device=DEVICE), torch.zeros(3, 4, 32, device=DEVICE),
                 cache, torch.zeros(3, dtype=torch.int64, device=DEVICE))
