"""BlockPool: every KV cache block, their ref counts, the LRU free queue and the prefix-cache map."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from strand.engine_core.core.kv_cache_utils import (
    BlockHash,
    BlockHashToBlockMap,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
)
from strand.engine_core.core.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBuffer,
)
from strand.engine_core.core.lowest_free_blocks import LowestFreeBlocks

logger = logging.getLogger(__name__)


class BlockPool:
    """Blocks 1..num_blocks-1 are allocatable; block 0 is reserved (padding in block tables).

    A free block may still hold a cached prefix: it stays findable by hash until evicted, and
    eviction takes the head of the free queue (uncached blocks, then least recently freed first).
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 2:
            raise ValueError(f"num_blocks must be >= 2 (block 0 is reserved), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self.null_block = self.blocks[0]
        self.null_block.ref_cnt = 1  # never freed, never handed out
        # Without caching nothing is evicted: the lowest free ids first keep requests' blocks
        # together (lowest_free_blocks.py).
        self.free_block_queue: FreeKVCacheBlockQueue | LowestFreeBlocks = (
            FreeKVCacheBlockQueue(self.blocks[1:]) if enable_caching
            else LowestFreeBlocks(self.blocks[1:]))
        # Every cached block by hash; a hash computed twice maps to both blocks (vLLM's map).
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        # Set by enable_kv_events(): cache changes recorded for a prefix-aware router.
        self.kv_events: KVEventBuffer | None = None
        self.kv_events_block_size = 0

    def enable_kv_events(self, block_size: int, max_events: int = 10_000) -> KVEventBuffer:
        self.kv_events = KVEventBuffer(max_events)
        self.kv_events_block_size = block_size
        return self.kv_events

    def get_num_free_blocks(self) -> int:
        """Blocks that can be allocated now, cached-but-free ones included."""
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """Fraction of allocatable blocks held by requests, in [0, 1]."""
        return 1.0 - self.free_block_queue.num_free_blocks / (self.num_blocks - 1)

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        return self.cached_block_hash_to_block.get(block_hash)

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-hit blocks, reviving free ones out of the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(f"cannot allocate {num_blocks} blocks: only "
                             f"{self.free_block_queue.num_free_blocks} are free")
        out = []
        for _ in range(num_blocks):
            block = self.free_block_queue.popleft()
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
            out.append(block)
        return out

    def uncache_block(self, block: KVCacheBlock) -> None:
        """Forget a block's hash (its content is not what the hash says)."""
        if block.block_hash is not None:
            self._evict(block)

    def _evict(self, block: KVCacheBlock) -> None:
        block_hash = block.block_hash
        assert block_hash is not None
        self.cached_block_hash_to_block.pop(block_hash, block.block_id)
        block.block_hash = None
        # A duplicate block may still hold the hash: only its last holder removes it.
        if self.kv_events is not None and block_hash not in self.cached_block_hash_to_block:
            self.kv_events.record(BlockRemoved([block_hash]))

    def cache_full_blocks(self, blocks: Sequence[KVCacheBlock], block_hashes: Sequence[BlockHash],
                          num_cached_blocks: int, num_full_blocks: int,
                          token_ids: Sequence[int] = ()) -> None:
        """Register blocks[num_cached_blocks:num_full_blocks] under their hashes.

        token_ids (the request's) only feed the BlockStored event when KV events are on.
        """
        table = self.cached_block_hash_to_block
        new_indices: list[int] = []
        for i in range(num_cached_blocks, num_full_blocks):
            block = blocks[i]
            if block.block_hash is not None:  # a prefix hit: already registered
                continue
            # A duplicate of a block already cached is cached too: each holder keeps its own.
            block.block_hash = block_hashes[i]
            if self.kv_events is not None and block_hashes[i] not in table:
                new_indices.append(i)
            table.insert(block_hashes[i], block)
        if new_indices:
            self._record_stored(new_indices, block_hashes, token_ids)

    def _record_stored(self, indices: list[int], block_hashes: Sequence[BlockHash],
                       token_ids: Sequence[int]) -> None:
        """One BlockStored per contiguous run of newly cached blocks (each run is a chain)."""
        assert self.kv_events is not None
        size = self.kv_events_block_size
        runs: list[list[int]] = []
        for i in indices:
            if runs and runs[-1][-1] == i - 1:
                runs[-1].append(i)
            else:
                runs.append([i])
        for run in runs:
            parent = block_hashes[run[0] - 1] if run[0] > 0 else None
            tokens = list(token_ids[run[0] * size:(run[-1] + 1) * size])
            self.kv_events.record(BlockStored([block_hashes[i] for i in run], parent,
                                              tokens, size))

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference each; pass them in eviction order (a request's tail first).

        Blocks that reach ref_cnt 0 keep the order given (vLLM's order): cached ones go to the
        tail of the free queue (a freed request's tail is reused before its prefix, blocks freed
        earlier before it); uncached ones (a partial tail) go to the head, since no hit can ever
        find them: they are reused before any cached block is evicted.
        """
        queue = self.free_block_queue
        uncached: list[KVCacheBlock] = []
        for block in ordered_blocks:
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.block_hash is None:
                    uncached.append(block)
                else:
                    queue.append(block)
        queue.prepend_n(uncached)

    def evict_cached_free_blocks(self) -> int:
        """Forget the prefixes of free blocks only (running requests keep theirs); how many.

        They move to the head of the free queue: caching nothing, they are reused first.
        """
        queue = self.free_block_queue
        evicted = [b for b in queue.get_all_free_blocks() if b.block_hash is not None]
        for block in evicted:
            self._evict(block)
            queue.remove(block)
            queue.appendleft(block)
        return len(evicted)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash; refused (False) while any block is held by a request."""
        num_used = self.num_blocks - 1 - self.free_block_queue.num_free_blocks
        if num_used > 0:
            logger.warning("Failed to reset the prefix cache: %d blocks are still in use "
                           "by running requests", num_used)
            return False
        for _, block in self.cached_block_hash_to_block.items():
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        if self.kv_events is not None:
            self.kv_events.record(AllBlocksCleared())
        logger.info("Prefix cache reset")
        return True
