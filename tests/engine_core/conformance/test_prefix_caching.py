"""tests/v1/core/test_prefix_caching.py: KVCacheManager / BlockPool prefix caching, eviction
order, duplicate blocks, statistics and reset."""

from __future__ import annotations

import pytest

from strand.engine_core.core.block_pool import BlockPool
from strand.engine_core.core.kv_cache_manager import KVCacheManager
from strand.engine_core.core.kv_cache_utils import (
    NONE_HASH,
    BlockHashToBlockMap,
    KVCacheBlock,
    get_hash_fn,
    hash_block_tokens,
    update_block_hashes,
)
from strand.engine_core.core.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from strand.engine_core.core.request import Request
from strand.engine_core.lora.request import LoRARequest
from tests.engine_core.core.conftest import make_request

BS = 16
SHA256 = get_hash_fn("sha256")


def _req(req_id: str, tokens: list[int], block_size: int = BS, **kw: object) -> Request:
    request = make_request(req_id, tokens, max_tokens=17, **kw)  # type: ignore[arg-type]
    update_block_hashes(request, block_size, SHA256)
    return request


def _free_ids(kv: KVCacheManager) -> list[int]:
    return [b.block_id for b in kv.block_pool.free_block_queue.get_all_free_blocks()]


def _alloc(kv: KVCacheManager, request: Request) -> tuple[list[int], int]:
    """Admit the whole prompt after its prefix hit: (new block ids, hit tokens)."""
    hits, num_hit = kv.get_computed_blocks(request)
    blocks = kv.allocate_slots(request, request.num_tokens - num_hit, hits)
    assert blocks is not None
    request.num_computed_tokens = request.num_tokens
    return [b.block_id for b in blocks], num_hit


COMMON = [i for i in range(3) for _ in range(BS)]  # three full blocks


def test_prefill() -> None:
    kv = KVCacheManager(11, BS)  # blocks 1..10
    req0 = _req("0", COMMON + [3] * 7)
    assert len(req0.block_hashes) == 3
    assert _alloc(kv, req0) == ([1, 2, 3, 4], 0)
    parent = NONE_HASH
    for block_id in (1, 2, 3):
        parent = hash_block_tokens(SHA256, parent, COMMON[(block_id - 1) * BS:block_id * BS])
        assert kv.block_pool.blocks[block_id].block_hash == parent
        assert kv.block_pool.blocks[block_id].ref_cnt == 1
    assert kv.block_pool.blocks[4].block_hash is None  # partial

    req1 = _req("1", COMMON + [3] * 5)
    assert _alloc(kv, req1) == ([5], 3 * BS)
    assert [kv.block_pool.blocks[i].ref_cnt for i in (1, 2, 3)] == [2, 2, 2]
    assert kv.block_pool.get_num_free_blocks() == 5

    kv.free(req0)
    kv.free(req1)
    # The uncached partial blocks at the head (the last freed first: 5, 4), then the
    # unallocated ones, then the cached common prefix tail first.
    assert _free_ids(kv) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]

    req2 = _req("2", COMMON + [3] * 6)
    assert _alloc(kv, req2) == ([5], 3 * BS)  # the partial block 5, reused at once
    assert kv.block_pool.get_num_free_blocks() == 6
    kv.free(req2)

    req3 = _req("3", [99] * (BS * 10))
    new_ids, num_hit = _alloc(kv, req3)
    assert num_hit == 0
    assert new_ids == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]  # the eviction order
    assert kv.block_pool.get_num_free_blocks() == 0


def test_prefill_plp() -> None:
    """Prompt logprobs read nothing from the cache, yet their computed blocks are cached: a
    block computed twice is cached twice (vLLM's BlockHashToBlockMap)."""
    kv = KVCacheManager(11, BS)
    req0 = _req("0", COMMON + [3] * 7, prompt_logprobs=5)
    assert _alloc(kv, req0) == ([1, 2, 3, 4], 0)
    req0_hashes = [kv.block_pool.blocks[i].block_hash for i in (1, 2, 3, 4)]
    assert req0_hashes[3] is None
    req1 = _req("1", COMMON + [3] * 5)
    assert _alloc(kv, req1) == ([5], 3 * BS)  # a plain request hits req0's blocks
    assert [kv.block_pool.blocks[i].ref_cnt for i in (1, 2, 3)] == [2, 2, 2]
    kv.free(req0)
    kv.free(req1)
    assert _free_ids(kv) == [5, 4, 6, 7, 8, 9, 10, 3, 2, 1]
    # A prompt-logprobs request misses the cache and computes req0's blocks again.
    req2 = _req("2", COMMON + [3] * 6, prompt_logprobs=5)
    new_ids, num_hit = _alloc(kv, req2)
    assert num_hit == 0 and new_ids == [5, 4, 6, 7]
    assert [kv.block_pool.blocks[i].block_hash for i in new_ids] == req0_hashes
    assert all(kv.block_pool.blocks[i].ref_cnt == 1 for i in new_ids)
    table = kv.block_pool.cached_block_hash_to_block
    for block_hash, ids in zip(req2.block_hashes, ({1, 5}, {2, 4}, {3, 6}), strict=True):
        assert {b.block_id for b in table.get_all(block_hash)} == ids
    kv.free(req2)
    assert _free_ids(kv) == [7, 8, 9, 10, 3, 2, 1, 6, 4, 5]
    # Evicting one copy leaves the other findable.
    kv.block_pool.get_new_blocks(5)  # 7, 8, 9, 10, 3
    assert kv.get_computed_blocks(_req("3", COMMON + [3]))[1] == 3 * BS


def test_decode() -> None:
    kv = KVCacheManager(11, BS)
    req0 = _req("0", COMMON + [3] * 7)
    _alloc(kv, req0)
    # Decode 10 tokens: the fourth block fills (and is cached), the tenth spills into a fifth.
    for token in range(10):
        req0.append_output_token_ids([token])
        update_block_hashes(req0, BS, SHA256)
        assert kv.allocate_slots(req0, 1) is not None
        req0.num_computed_tokens += 1
    assert len(req0.block_hashes) == 4
    fourth = kv.req_to_blocks["0"][3]
    assert fourth.block_hash == req0.block_hashes[3]
    assert len(kv.req_to_blocks["0"]) == 5


def test_evict() -> None:
    kv = KVCacheManager(11, BS)
    last = _req("0", list(range(5 * BS + 7)))
    assert _alloc(kv, last)[0] == [1, 2, 3, 4, 5, 6]
    second = _req("1", list(range(5 * BS + 7, 8 * BS + 7)))
    assert _alloc(kv, second)[0] == [7, 8, 9]  # 3 full blocks
    assert kv.block_pool.get_num_free_blocks() == 1
    kv.free(last)
    # The partial block (no hash) at the head, the cached ones at the tail (LRU).
    assert _free_ids(kv) == [6, 10, 5, 4, 3, 2, 1]
    kv.free(second)
    assert _free_ids(kv) == [6, 10, 5, 4, 3, 2, 1, 9, 8, 7]
    # A hit on "last"'s first two blocks revives them; the new tail comes from the queue head.
    req2 = _req("2", list(range(2 * BS + 3)))
    assert _alloc(kv, req2) == ([6], 2 * BS)
    assert kv.block_pool.get_num_free_blocks() == 7
    assert _free_ids(kv) == [10, 5, 4, 3, 9, 8, 7]


def test_free_puts_uncached_blocks_at_the_head_tail_first() -> None:
    """Blocks without a hash reach the head in the order freed (a request's tail first); cached
    ones keep theirs at the tail. Nothing cached is evicted while an uncached block is free."""
    kv = KVCacheManager(11, BS)
    cached = _req("0", list(range(2 * BS + 1)))
    assert _alloc(kv, cached)[0] == [1, 2, 3]
    # Admitted but given up before its forward: none of its blocks holds what its hash says.
    uncomputed = _req("1", list(range(100, 100 + 3 * BS + 5)))
    hits, _ = kv.get_computed_blocks(uncomputed)
    assert [b.block_id for b in kv.allocate_slots(uncomputed, uncomputed.num_tokens, hits) or []] \
        == [4, 5, 6, 7]
    kv.free(cached)
    assert _free_ids(kv) == [3, 8, 9, 10, 2, 1]
    kv.free(uncomputed)
    assert _free_ids(kv) == [7, 6, 5, 4, 3, 8, 9, 10, 2, 1]
    assert all(kv.block_pool.blocks[i].block_hash is None for i in (7, 6, 5, 4, 3))
    # The next request takes every uncached block before evicting the cached prefix.
    assert _alloc(kv, _req("2", [7] * (7 * BS)))[0] == [7, 6, 5, 4, 3, 8, 9]
    assert kv.get_computed_blocks(_req("3", list(range(2 * BS + 1))))[1] == 2 * BS


def test_hash_block_correct_reuse() -> None:
    """A block reused for other tokens no longer answers to its old hash."""
    kv = KVCacheManager(2, BS)  # one allocatable block
    req0 = _req("0", list(range(BS)) + [0])  # needs 2 blocks: refused, then a smaller one
    assert kv.allocate_slots(req0, req0.num_tokens) is None
    req0 = _req("0", list(range(BS)))
    _alloc(kv, req0)
    assert kv.block_pool.blocks[1].block_hash == req0.block_hashes[0]
    kv.free(req0)
    req1 = _req("1", list(range(BS - 1)))  # same first tokens, not a full block
    assert _alloc(kv, req1) == ([1], 0)
    assert kv.block_pool.blocks[1].block_hash is None  # evicted on reuse


def test_computed_blocks_not_evicted() -> None:
    kv = KVCacheManager(3, BS)  # blocks 1, 2
    req0 = _req("0", list(range(BS)))
    _alloc(kv, req0)
    req1 = _req("1", list(range(BS, 2 * BS)))
    _alloc(kv, req1)
    kv.free(req0)
    kv.free(req1)
    # req2 hits block 1; its new block must come from elsewhere (block 2), not evict block 1.
    req2 = _req("2", list(range(BS)) + [7])
    assert _alloc(kv, req2) == ([2], BS)
    assert kv.req_to_blocks["2"][0].block_id == 1


def test_basic_prefix_caching_disabled() -> None:
    kv = KVCacheManager(5, BS, enable_caching=False)
    req1 = _req("1", list(range(10)))
    assert _alloc(kv, req1) == ([1], 0)
    kv.free(req1)
    req2 = _req("2", list(range(10)))
    assert _alloc(kv, req2)[1] == 0  # nothing cached
    assert all(b.block_hash is None for b in kv.block_pool.blocks)
    req3 = _req("3", list(range(4 * BS)))
    assert kv.allocate_slots(req3, req3.num_tokens) is None  # only 3 blocks left


def test_cache_key_salting() -> None:
    kv = KVCacheManager(11, BS)
    salted = _req("0", COMMON + [3], cache_salt="salt1")
    _alloc(kv, salted)
    assert kv.get_computed_blocks(_req("1", COMMON + [3]))[1] == 0
    assert kv.get_computed_blocks(_req("2", COMMON + [3], cache_salt="salt2"))[1] == 0
    assert kv.get_computed_blocks(_req("3", COMMON + [3], cache_salt="salt1"))[1] == 3 * BS


def test_lora_prefix_caching() -> None:
    """vLLM's: the adapter keys the hash, so the same tokens under another adapter (or none)
    never hit; with a salt too, both must match."""
    def lora_req(req_id: str, lora_id: int | None, salt: str | None = None) -> Request:
        request = make_request(req_id, COMMON + [3], max_tokens=17, cache_salt=salt)
        if lora_id is not None:
            request.lora_request = LoRARequest(f"lora{lora_id}", lora_id, "/adapters/x")
        update_block_hashes(request, BS, SHA256)
        return request

    kv = KVCacheManager(11, BS)
    _alloc(kv, lora_req("0", 1))
    assert kv.get_computed_blocks(lora_req("1", None))[1] == 0
    assert kv.get_computed_blocks(lora_req("2", 2))[1] == 0
    assert kv.get_computed_blocks(lora_req("3", 1))[1] == 3 * BS
    assert kv.get_computed_blocks(lora_req("4", 1, salt="s"))[1] == 0
    _alloc(kv, lora_req("5", 2, salt="s"))
    assert kv.get_computed_blocks(lora_req("6", 2, salt="s"))[1] == 3 * BS
    assert kv.get_computed_blocks(lora_req("7", 1, salt="s"))[1] == 0


def test_prefill_not_enough_free_blocks_with_computed_blocks() -> None:
    kv = KVCacheManager(11, BS)
    req0 = _req("0", COMMON[:2 * BS] + [9])
    _alloc(kv, req0)  # blocks 1, 2 (cached), 3
    req1 = _req("1", list(range(200, 200 + 6 * BS)))
    _alloc(kv, req1)  # 6 more: 1 left free
    kv.free(req0)  # 1, 2 cached and free again
    req2 = _req("2", COMMON[:2 * BS] + list(range(300, 300 + 3 * BS)))
    hits, num_hit = kv.get_computed_blocks(req2)
    assert num_hit == 2 * BS
    # Two hits to revive and three new blocks: more than the 4 free (hits included).
    before = (_free_ids(kv), [b.ref_cnt for b in kv.block_pool.blocks])
    assert kv.allocate_slots(req2, req2.num_tokens - num_hit, hits) is None
    assert (_free_ids(kv), [b.ref_cnt for b in kv.block_pool.blocks]) == before
    assert kv.prefix_cache_stats.requests == 2  # the failed admission counted nothing


def test_reset_prefix_cache() -> None:
    kv = KVCacheManager(11, BS)
    req0 = _req("0", COMMON + [3])
    _alloc(kv, req0)
    assert not kv.reset_prefix_cache()  # blocks in use
    assert len(kv.block_pool.cached_block_hash_to_block) == 3
    kv.free(req0)
    assert kv.reset_prefix_cache()
    assert len(kv.block_pool.cached_block_hash_to_block) == 0
    assert all(b.block_hash is None for b in kv.block_pool.blocks)
    assert kv.prefix_cache_stats.requests == 0


def test_prefix_cache_stats_disabled() -> None:
    kv = KVCacheManager(11, BS, enable_caching=False)
    _alloc(kv, _req("0", COMMON + [3]))
    stats = kv.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (0, 0, 0)


def test_prefix_cache_stats_preempted() -> None:
    """vLLM's PrefixCacheStats.record(preempted=...): a resumed request's lookup is counted
    apart, so recomputation does not count as new traffic."""
    kv = KVCacheManager(11, BS)
    req0 = _req("0", COMMON + [3])
    _alloc(kv, req0)
    kv.free(req0)  # as a preemption does
    req0.num_preemptions = 1
    req0.num_computed_tokens = 0
    _alloc(kv, req0)
    stats = kv.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (1, 3 * BS + 1, 0)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (
        1, 3 * BS + 1, 3 * BS)
    assert kv.caching_metrics.hit_rate == 0.0  # the window sees first admissions only


def test_prefix_cache_stats_skip_prompt_logprobs() -> None:
    kv = KVCacheManager(11, BS)
    _alloc(kv, _req("0", COMMON + [3], prompt_logprobs=1))
    assert kv.make_prefix_cache_stats().requests == 0


def test_maybe_evict_cached_block() -> None:
    pool = BlockPool(5)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(blocks, [b"h0", b"h1", b"h0"], 0, 3)  # block 3 duplicates block 1
    table = pool.cached_block_hash_to_block
    assert {b.block_id for b in table.get_all(b"h0")} == {1, 3}
    pool.uncache_block(blocks[0])
    assert blocks[0].block_hash is None
    assert table.get(b"h0") is blocks[2]
    pool.uncache_block(blocks[2])
    assert b"h0" not in table and table.get(b"h1") is blocks[1]
    pool.uncache_block(blocks[2])  # not cached any more: nothing happens
    assert len(table) == 1


def test_duplicate_blocks_both_freed_and_reset() -> None:
    pool = BlockPool(5)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(blocks, [b"h", b"h"], 0, 2)
    pool.free_blocks(reversed(blocks))
    assert pool.reset_prefix_cache()
    assert all(b.block_hash is None for b in blocks) and len(pool.cached_block_hash_to_block) == 0


def test_block_lookup_cache_single_block_per_key() -> None:
    cache = BlockHashToBlockMap()
    blocks = [KVCacheBlock(i) for i in range(3)]
    for i, block in enumerate(blocks):
        cache.insert(b"hash%d" % i, block)
    for i, block in enumerate(blocks):
        assert cache.get(b"hash%d" % i) is block
    assert cache.get(b"missing") is None
    assert cache.pop(b"hash0", 1) is None  # another block id: nothing removed
    assert cache.get(b"hash0") is blocks[0]
    assert cache.pop(b"hash0", 0) is blocks[0]
    assert cache.get(b"hash0") is None
    assert cache.pop(b"hash0", 0) is None


def test_block_lookup_cache_multi_blocks_per_key() -> None:
    cache = BlockHashToBlockMap()
    b11, b12, b21 = KVCacheBlock(11), KVCacheBlock(12), KVCacheBlock(21)
    cache.insert(b"hash0", b11)
    cache.insert(b"hash0", b12)
    cache.insert(b"hash1", b21)
    assert cache.get(b"hash0") in (b11, b12)
    assert cache.pop(b"hash0", 11) is b11
    assert cache.get(b"hash0") is b12
    assert cache.pop(b"hash0", 12) is b12
    assert b"hash0" not in cache
    assert cache.get(b"hash1") is b21


@pytest.mark.parametrize("blocks_to_cache", [2, 3, 10])
def test_kv_cache_events(blocks_to_cache: int) -> None:
    """vLLM's: a prompt's full blocks are one BlockStored with every hash; taking the events
    empties the queue; another prompt evicting them is one BlockRemoved per block, then its own
    BlockStored; a reset is AllBlocksCleared."""
    kv = KVCacheManager(num_blocks=blocks_to_cache + 1, block_size=BS)  # block 0: reserved
    events = kv.block_pool.enable_kv_events(BS)
    num_tokens = BS * blocks_to_cache
    first = _req("0", list(range(num_tokens)))
    _alloc(kv, first)
    batch = events.take()
    assert batch is not None
    stored = batch.events[-1]
    assert isinstance(stored, BlockStored)
    cached = kv.block_pool.cached_block_hash_to_block
    assert len(stored.block_hashes) == blocks_to_cache == len(cached)
    assert len(stored.token_ids) == stored.block_size * len(stored.block_hashes)
    assert len(events) == 0 and events.take() is None
    kv.free(first)
    second = _req("1", list(range(10_000, 10_000 + num_tokens)))  # evicts every cached block
    _alloc(kv, second)
    batch = events.take()
    assert batch is not None
    assert len(batch.events) == blocks_to_cache + 1
    for removed in batch.events[:-1]:
        assert isinstance(removed, BlockRemoved)
        assert removed.block_hashes[0] in stored.block_hashes
    last = batch.events[-1]
    assert isinstance(last, BlockStored)
    assert len(last.block_hashes) == blocks_to_cache == len(cached)
    kv.free(second)
    assert kv.reset_prefix_cache()
    batch = events.take()
    assert batch is not None and isinstance(batch.events[-1], AllBlocksCleared)
    assert len(cached) == 0


@pytest.mark.parametrize("name", [
    "test_prefill_hybrid_model", "test_cache_blocks_multi_group", "test_mm_prefix_caching",
    "test_eagle_enabled_removes_last_block", "test_allocate_with_lookahead",
])
def test_missing_features(name: str) -> None:
    missing = {
        "test_prefill_hybrid_model": "hybrid KV cache groups (sliding window / mamba groups)",
        "test_cache_blocks_multi_group": "hybrid KV cache groups",
        "test_mm_prefix_caching": "multimodal inputs",
        "test_eagle_enabled_removes_last_block": "speculative decoding (EAGLE)",
        "test_allocate_with_lookahead": "speculative decoding lookahead slots",
    }
    pytest.skip(f"missing feature: {missing[name]}")
