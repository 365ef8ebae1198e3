"""KVCacheManager: each request's block table, prefix-cache lookups, allocate and free."""

from __future__ import annotations

from strand.engine_core.core.block_pool import BlockPool
from strand.engine_core.core.kv_cache_utils import KVCacheBlock
from strand.engine_core.core.request import Request
from strand.engine_core.core.stats import CachingMetrics, PrefixCacheStats


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # req_id -> how many of its leading blocks are registered in the prefix cache.
        self.num_cached_block: dict[str, int] = {}
        self.prefix_cache_stats = PrefixCacheStats()
        # The same counts never reset: Prometheus counters must only grow.
        self.prefix_cache_totals = PrefixCacheStats()
        self.caching_metrics = CachingMetrics()

    @property
    def num_blocks(self) -> int:
        return self.block_pool.num_blocks

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest cached prefix of a request that holds no blocks, and its token count.

        Capped below num_tokens: the last token is always computed, since its logits are needed.
        Takes no references; allocate_slots does.
        """
        if not self.enable_caching or request.skips_cached_prefix:
            # Prompt logprobs need the logits of every prompt position (and MEAN pooling their
            # hidden states): nothing may be skipped.
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = request.block_hashes
        get = self.block_pool.cached_block_hash_to_block.get
        blocks = []
        for i in range(min(max_blocks, len(hashes))):
            block = get(hashes[i])
            if block is None:
                break
            blocks.append(block)
        return blocks, len(blocks) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[KVCacheBlock] | None = None,
                       ) -> list[KVCacheBlock] | None:
        """Make room for num_new_tokens after the computed ones; None (nothing changes) if the
        pool cannot, even after evicting free cached blocks.

        new_computed_blocks: prefix hits from get_computed_blocks for a request being admitted;
        request.num_computed_tokens must not count them yet. Returns the newly allocated blocks.
        """
        req_id = request.request_id
        req_blocks = self.req_to_blocks.get(req_id)
        if req_blocks is not None and not new_computed_blocks:
            # Fast path of a decode step: room left in the last block, nothing new to cache.
            num_total = request.num_computed_tokens + num_new_tokens
            if (num_total <= len(req_blocks) * self.block_size
                    and (not self.enable_caching
                         or num_total // self.block_size <= self.num_cached_block[req_id])):
                return []
        is_new = req_blocks is None
        if req_blocks is None:
            req_blocks = []
        hits = new_computed_blocks or []
        num_computed = request.num_computed_tokens + len(hits) * self.block_size
        num_total = num_computed + num_new_tokens
        num_needed = -(-num_total // self.block_size) - len(req_blocks) - len(hits)
        pool = self.block_pool
        if hits:
            # Reviving a free hit takes it out of the free queue, so it no longer counts as free.
            num_revived = sum(1 for b in hits if b.ref_cnt == 0)
            if num_needed + num_revived > pool.free_block_queue.num_free_blocks:
                return None
            pool.touch(hits)
            req_blocks.extend(hits)
        elif num_needed > pool.free_block_queue.num_free_blocks:
            return None
        if is_new:
            self.req_to_blocks[req_id] = req_blocks
            self.num_cached_block[req_id] = len(hits)
            # Recorded here, once the admission succeeds: a request retried after a failed
            # allocation counts once. A request that may not read the cache looked nothing up.
            if self.enable_caching and not request.skips_cached_prefix:
                self._record_lookup(request, len(hits) * self.block_size)
        new_blocks = pool.get_new_blocks(num_needed) if num_needed > 0 else []
        if new_blocks:
            req_blocks.extend(new_blocks)
        if self.enable_caching:
            # Registered before the runner computes them: within one step the backend writes
            # every new K/V before attending, so a hit on them in this same step is still valid.
            num_full = min(num_total // self.block_size, len(request.block_hashes))
            num_cached = self.num_cached_block[req_id]
            if num_full > num_cached:
                pool.cache_full_blocks(req_blocks, request.block_hashes, num_cached, num_full,
                                      request.all_token_ids)
                self.num_cached_block[req_id] = num_full
        return new_blocks

    def _record_lookup(self, request: Request, num_hit_tokens: int) -> None:
        preempted = request.num_preemptions > 0
        self.prefix_cache_stats.record(request.num_tokens, num_hit_tokens, preempted)
        self.prefix_cache_totals.record(request.num_tokens, num_hit_tokens, preempted)
        if not preempted:
            self.caching_metrics.observe(PrefixCacheStats(1, request.num_tokens, num_hit_tokens))

    def free(self, request: Request) -> None:
        """Release a request's blocks, tail first so its tail is evicted before its prefix."""
        blocks = self.req_to_blocks.pop(request.request_id, None)
        self.num_cached_block.pop(request.request_id, None)
        if not blocks:
            return
        if self.enable_caching:
            # Blocks are registered when allocated, before their step computes them. A request
            # given up before that forward (a priority-preemption victim scheduled earlier in the
            # same step) leaves them uncomputed: they must not stay in the prefix cache.
            for block in blocks[request.num_computed_tokens // self.block_size:]:
                if block.ref_cnt == 1 and block.block_hash is not None:
                    self.block_pool.uncache_block(block)
        self.block_pool.free_blocks(reversed(blocks))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, ())]

    def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix and the hit counters; False while any block is in use."""
        if not self.block_pool.reset_prefix_cache():
            return False
        self.prefix_cache_stats = PrefixCacheStats()
        self.caching_metrics.reset()
        return True

    def make_prefix_cache_stats(self) -> PrefixCacheStats:
        return self.prefix_cache_stats.copy()
