from __future__ import annotations

import pytest

from strand.engine_core.core.block_pool import BlockPool
from strand.engine_core.core.kv_cache_utils import (
    NONE_HASH,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    get_hash_fn,
    hash_block_tokens,
    update_block_hashes,
)
from tests.engine_core.core.conftest import make_request


def test_free_queue_removes_from_the_middle_and_keeps_order() -> None:
    blocks = [KVCacheBlock(i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    queue.remove(blocks[2])
    assert [b.block_id for b in queue.get_all_free_blocks()] == [0, 1, 3, 4]
    assert queue.num_free_blocks == 4
    assert queue.popleft().block_id == 0
    queue.append(blocks[2])
    queue.appendleft(blocks[0])
    assert [b.block_id for b in queue.get_all_free_blocks()] == [0, 1, 3, 4, 2]


def test_free_queue_refuses_double_insert_and_pop_when_empty() -> None:
    block = KVCacheBlock(1)
    queue = FreeKVCacheBlockQueue([block])
    with pytest.raises(ValueError, match="already in the free queue"):
        queue.append(block)
    queue.popleft()
    with pytest.raises(ValueError, match="no free blocks"):
        queue.popleft()


def test_block_zero_is_reserved() -> None:
    pool = BlockPool(8)
    assert pool.get_num_free_blocks() == 7
    ids = [b.block_id for b in pool.get_new_blocks(7)]
    assert sorted(ids) == list(range(1, 8))
    assert pool.get_usage() == 1.0


def test_pool_needs_two_blocks() -> None:
    with pytest.raises(ValueError, match="num_blocks must be >= 2"):
        BlockPool(1)


def test_get_new_blocks_beyond_free_raises() -> None:
    pool = BlockPool(4)
    with pytest.raises(ValueError, match="only 3 are free"):
        pool.get_new_blocks(4)


def test_freed_cached_block_stays_findable_until_reused() -> None:
    pool = BlockPool(3)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks([a], [b"h-a"], 0, 1)
    pool.free_blocks([b, a])
    assert pool.get_cached_block(b"h-a") is a
    # The uncached block b went to the head: reused before the cached one.
    assert pool.get_new_blocks(1) == [b]
    assert pool.get_cached_block(b"h-a") is a
    assert pool.get_new_blocks(1) == [a]
    assert pool.get_cached_block(b"h-a") is None
    assert a.block_hash is None


def test_touch_revives_a_free_cached_block() -> None:
    pool = BlockPool(3)
    (a,) = pool.get_new_blocks(1)
    pool.cache_full_blocks([a], [b"h"], 0, 1)
    pool.free_blocks([a])
    assert pool.get_num_free_blocks() == 2
    pool.touch([a])
    assert a.ref_cnt == 1
    assert pool.get_num_free_blocks() == 1


def test_reset_refused_while_blocks_are_held() -> None:
    pool = BlockPool(4)
    (a,) = pool.get_new_blocks(1)
    pool.cache_full_blocks([a], [b"h"], 0, 1)
    assert pool.reset_prefix_cache() is False
    assert pool.get_cached_block(b"h") is a
    pool.free_blocks([a])
    assert pool.reset_prefix_cache() is True
    assert pool.get_cached_block(b"h") is None


def test_block_hash_chains_on_the_parent() -> None:
    fn = get_hash_fn("sha256")
    first = hash_block_tokens(fn, NONE_HASH, [1, 2])
    assert hash_block_tokens(fn, first, [3, 4]) != hash_block_tokens(fn, NONE_HASH, [3, 4])
    assert hash_block_tokens(fn, NONE_HASH, [1, 2]) == first
    assert len(first) == 32


def test_fast_hash_differs_from_sha256_but_is_deterministic() -> None:
    fast = get_hash_fn("xxhash")
    assert fast(b"abc") == fast(b"abc")
    assert fast(b"abc") != get_hash_fn("sha256")(b"abc")


def test_unknown_hash_algo_is_refused() -> None:
    with pytest.raises(ValueError, match="prefix_caching_hash_algo"):
        get_hash_fn("md5")


def test_only_full_blocks_are_hashed_as_tokens_arrive() -> None:
    request = make_request("r", [1, 2, 3, 4, 5, 6, 7])
    fn = get_hash_fn("sha256")
    update_block_hashes(request, 4, fn)
    assert len(request.block_hashes) == 1
    request.append_output_token_ids([8])
    update_block_hashes(request, 4, fn)
    assert len(request.block_hashes) == 2
    assert request.block_hashes[1] == hash_block_tokens(fn, request.block_hashes[0], [5, 6, 7, 8])


def test_cache_salt_changes_every_block_hash() -> None:
    fn = get_hash_fn("sha256")
    plain = make_request("a", [1] * 8)
    salted = make_request("b", [1] * 8, cache_salt="tenant-1")
    for r in (plain, salted):
        update_block_hashes(r, 4, fn)
    assert plain.block_hashes[0] != salted.block_hashes[0]
    assert plain.block_hashes[1] != salted.block_hashes[1]
