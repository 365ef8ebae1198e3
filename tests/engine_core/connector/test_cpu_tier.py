"""CPUBlockTier: a bounded LRU of whole blocks keyed by hash."""

from __future__ import annotations

import pytest
import torch

from tests.engine_core.connector.conftest import block_of, hashes, make_tier, random_kv_caches


def test_saved_blocks_load_back_into_other_blocks_unchanged() -> None:
    tier = make_tier(4)
    source = random_kv_caches(6, seed=1)
    target = random_kv_caches(6, seed=2)
    assert tier.save([2, 5], hashes("a", "b"), source) == 2
    tier.load(tier.acquire(hashes("a", "b")), [1, 3], target)
    assert torch.equal(block_of(target, 1), block_of(source, 2))
    assert torch.equal(block_of(target, 3), block_of(source, 5))


def test_load_leaves_other_blocks_alone() -> None:
    tier = make_tier(2)
    source = random_kv_caches(4, seed=1)
    target = random_kv_caches(4, seed=2)
    before = [block_of(target, i).clone() for i in range(4)]
    tier.save([1], hashes("a"), source)
    tier.load(tier.acquire(hashes("a")), [2], target)
    for i in (0, 1, 3):
        assert torch.equal(block_of(target, i), before[i])


def test_a_block_already_held_is_not_copied_again() -> None:
    tier = make_tier(4)
    caches = random_kv_caches(4)
    assert tier.save([1], hashes("a"), caches) == 1
    assert tier.save([2, 3], hashes("a", "b"), caches) == 1
    assert len(tier) == 2


def test_a_full_tier_evicts_the_least_recently_used_block() -> None:
    tier = make_tier(2)
    caches = random_kv_caches(4)
    tier.save([1, 2], hashes("a", "b"), caches)
    tier.acquire(hashes("a"))  # a load touches "a": "b" is now the oldest
    tier.release([0])
    tier.save([3], hashes("c"), caches)
    assert b"a" in tier
    assert b"b" not in tier
    assert b"c" in tier


def test_a_slot_a_planned_load_reads_is_never_overwritten() -> None:
    tier = make_tier(1)
    source = random_kv_caches(4, seed=1)
    tier.save([1], hashes("a"), source)
    slots = tier.acquire(hashes("a"))
    assert tier.save([2], hashes("b"), source) == 0  # the only slot is being read
    target = random_kv_caches(4, seed=2)
    tier.load(slots, [3], target)
    assert torch.equal(block_of(target, 3), block_of(source, 1))
    assert tier.save([2], hashes("b"), source) == 1  # released: reusable again


def test_clear_during_a_planned_load_keeps_its_data_until_loaded() -> None:
    tier = make_tier(1)
    source = random_kv_caches(4, seed=1)
    tier.save([1], hashes("a"), source)
    slots = tier.acquire(hashes("a"))
    assert tier.clear() == 1
    assert tier.save([2], hashes("b"), source) == 0
    target = random_kv_caches(4, seed=2)
    tier.load(slots, [3], target)
    assert torch.equal(block_of(target, 3), block_of(source, 1))
    assert tier.save([2], hashes("b"), source) == 1


def test_leading_hits_stop_at_the_first_missing_block() -> None:
    tier = make_tier(4)
    tier.save([1, 3], hashes("a", "c"), random_kv_caches(4))
    chain = hashes("a", "b", "c")
    assert tier.num_leading_hits(chain) == 1
    assert tier.num_leading_hits(chain, start=2) == 1
    assert tier.num_leading_hits(hashes("a", "c"), limit=1) == 1


def test_clear_returns_the_number_of_blocks_dropped() -> None:
    tier = make_tier(4)
    tier.save([1, 2, 3], hashes("a", "b", "c"), random_kv_caches(4))
    assert tier.clear() == 3
    assert len(tier) == 0
    assert tier.num_leading_hits(hashes("a")) == 0


def test_a_tier_needs_at_least_one_slot() -> None:
    with pytest.raises(ValueError, match="num_slots must be >= 1"):
        make_tier(0)
