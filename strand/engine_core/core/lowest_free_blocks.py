"""The free blocks of a pool without prefix caching, handed out lowest id first.

With prefix caching, the free queue's order is the eviction order (least recently freed first,
a request's tail before its prefix: FreeKVCacheBlockQueue, as vLLM). Without it a free block
holds nothing worth keeping, and only where its memory lies matters: a pool handed out in the
order the last requests freed their blocks gives a new request blocks scattered over the whole
cache (its prompt's blocks in reverse and interleaved with 63 other requests' decode blocks,
after a batch of 64), and the decode attention that walks them ran the standard workload
measurably slower than on a fresh pool. The lowest free ids first keep a
request's blocks together where the pool allows, as on a fresh pool.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from strand.engine_core.core.kv_cache_utils import KVCacheBlock


class LowestFreeBlocks:
    """FreeKVCacheBlockQueue's interface; popleft takes the lowest free block id, and append,
    appendleft and prepend_n are the same (no eviction order to keep)."""

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        self._by_id: dict[int, KVCacheBlock] = {}
        self._heap: list[int] = []
        for block in blocks:
            self.append(block)

    @property
    def num_free_blocks(self) -> int:
        return len(self._heap)

    def popleft(self) -> KVCacheBlock:
        if not self._heap:
            raise ValueError("no free blocks left in the KV cache pool")
        return self._by_id.pop(heapq.heappop(self._heap))

    def append(self, block: KVCacheBlock) -> None:
        if block.block_id in self._by_id:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        self._by_id[block.block_id] = block
        heapq.heappush(self._heap, block.block_id)

    appendleft = append

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        for block in blocks:
            self.append(block)

    def remove(self, block: KVCacheBlock) -> None:
        # Only a prefix hit revives a free block, and without caching there are none: O(n).
        if self._by_id.pop(block.block_id, None) is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        self._heap.remove(block.block_id)
        heapq.heapify(self._heap)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """In the order they would be handed out. For tests and checks, not the hot path."""
        return [self._by_id[i] for i in sorted(self._heap)]


__all__ = ["LowestFreeBlocks"]
