"""A pool without prefix caching hands out its lowest free block ids first, whatever order the
last requests freed theirs in (strand/engine_core/core/lowest_free_blocks.py)."""

from __future__ import annotations

import random

import pytest

from strand.engine_core.core.block_pool import BlockPool
from strand.engine_core.core.kv_cache_utils import FreeKVCacheBlockQueue
from strand.engine_core.core.lowest_free_blocks import LowestFreeBlocks


def test_after_scattered_frees_a_request_gets_the_lowest_ids_together() -> None:
    pool = BlockPool(num_blocks=65, enable_caching=False)
    assert isinstance(pool.free_block_queue, LowestFreeBlocks)
    # Eight requests grow in turn (decode: one block each at a time), as a batch does.
    held: list[list] = [[] for _ in range(8)]
    for _ in range(6):
        for blocks in held:
            blocks += pool.get_new_blocks(1)
    assert [b.block_id for b in held[0]] == [1, 9, 17, 25, 33, 41]
    order = list(range(8))
    random.Random(0).shuffle(order)
    for i in order:
        pool.free_blocks(reversed(held[i]))  # a request's tail first, as the manager frees
    assert pool.get_num_free_blocks() == 64
    # The next request's prompt: contiguous, as on a fresh pool (the LRU queue would have given
    # the last freed request's blocks, tail first: 8 apart and descending).
    assert [b.block_id for b in pool.get_new_blocks(6)] == [1, 2, 3, 4, 5, 6]


def test_with_caching_the_free_queue_keeps_the_eviction_order() -> None:
    pool = BlockPool(num_blocks=9, enable_caching=True)
    assert isinstance(pool.free_block_queue, FreeKVCacheBlockQueue)
    first, second = pool.get_new_blocks(2), pool.get_new_blocks(2)
    pool.free_blocks(reversed(second))
    pool.free_blocks(reversed(first))
    # Uncached blocks go to the head, the last freed request's tail first (vLLM's order), not
    # lowest id first.
    assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == \
        [2, 1, 4, 3, 5, 6, 7, 8]


def test_the_free_set_refuses_what_the_queue_refuses() -> None:
    pool = BlockPool(num_blocks=5, enable_caching=False)
    free = pool.free_block_queue
    block = free.popleft()
    assert block.block_id == 1 and free.num_free_blocks == 3
    free.append(block)
    with pytest.raises(ValueError, match="block 1 is already in the free queue"):
        free.appendleft(block)
    free.remove(pool.blocks[3])
    with pytest.raises(ValueError, match="block 3 is not in the free queue"):
        free.remove(pool.blocks[3])
    assert [b.block_id for b in free.get_all_free_blocks()] == [1, 2, 4]
    for _ in range(3):
        free.popleft()
    with pytest.raises(ValueError, match="no free blocks left"):
        free.popleft()
    with pytest.raises(ValueError, match="cannot allocate 1 blocks: only 0 are free"):
        pool.get_new_blocks(1)
