"""tests/v1/core/test_kv_cache_utils.py: blocks, the free block queue, block hashing and the
windowed prefix-cache hit rate (CachingMetrics)."""

from __future__ import annotations

import pytest

from strand.engine_core.core.kv_cache_utils import (
    NONE_HASH,
    FreeKVCacheBlockQueue,
    KVCacheBlock,
    block_extra_keys,
    get_hash_fn,
    hash_block_tokens,
    update_block_hashes,
)
from strand.engine_core.core.stats import CachingMetrics, PrefixCacheStats
from tests.engine_core.core.conftest import make_request

SHA256 = get_hash_fn("sha256")


def _ids(queue: FreeKVCacheBlockQueue) -> list[int]:
    return [b.block_id for b in queue.get_all_free_blocks()]


def test_none_hash() -> None:
    # A fixed root, identical across processes, so hashes agree between engines.
    assert isinstance(NONE_HASH, bytes) and len(NONE_HASH) == 32
    assert hash_block_tokens(SHA256, NONE_HASH, [1, 2]) == hash_block_tokens(
        SHA256, NONE_HASH, [1, 2])


def test_kv_cache_block() -> None:
    block = KVCacheBlock(block_id=0)
    assert (block.block_id, block.ref_cnt, block.block_hash) == (0, 0, None)
    block.ref_cnt += 1
    block.block_hash = b"h"
    assert (block.ref_cnt, block.block_hash) == (1, b"h")
    block.block_hash = None
    assert block.block_hash is None


def test_free_kv_cache_block_queue_initialization() -> None:
    blocks = [KVCacheBlock(1)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.num_free_blocks == 1
    assert _ids(queue) == [1]


def test_free_kv_cache_block_queue_operations() -> None:
    blocks = [KVCacheBlock(i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.popleft() is blocks[0]
    assert queue.num_free_blocks == 4
    queue.remove(blocks[2])  # from the middle
    assert _ids(queue) == [1, 3, 4]
    queue.append(blocks[0])
    assert _ids(queue) == [1, 3, 4, 0]
    for _ in range(4):
        queue.popleft()
    assert queue.num_free_blocks == 0
    with pytest.raises(ValueError, match="no free blocks"):
        queue.popleft()


def test_free_kv_cache_block_queue_append_n() -> None:
    blocks = [KVCacheBlock(i) for i in range(6)]
    queue = FreeKVCacheBlockQueue([])
    for block in blocks[:3]:
        queue.append(block)
    assert _ids(queue) == [0, 1, 2]
    for block in blocks[3:]:
        queue.append(block)
    assert _ids(queue) == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="already in the free queue"):
        queue.append(blocks[0])


def test_free_kv_cache_block_queue_prepend_n() -> None:
    blocks = [KVCacheBlock(i) for i in range(6)]
    queue = FreeKVCacheBlockQueue(blocks[0:1])
    queue.prepend_n([])  # a no-op
    assert _ids(queue) == [0]
    # In front of the existing head, in the order given.
    queue.prepend_n(blocks[4:6])
    assert queue.num_free_blocks == 3
    assert _ids(queue) == [4, 5, 0]
    queue.prepend_n(blocks[1:3])
    assert _ids(queue) == [1, 2, 4, 5, 0]
    assert queue.popleft() is blocks[1]
    with pytest.raises(ValueError, match="already in the free queue"):
        queue.prepend_n([blocks[3], blocks[0]])


def test_free_kv_cache_block_queue_pop_n() -> None:
    blocks = [KVCacheBlock(i) for i in range(6)]
    queue = FreeKVCacheBlockQueue(blocks)
    popped = [queue.popleft() for _ in range(3)]
    assert [b.block_id for b in popped] == [0, 1, 2]
    assert all(b.prev_free is None and b.next_free is None for b in popped)
    assert _ids(queue) == [3, 4, 5]


def test_free_kv_cache_block_queue_get_all_free_blocks() -> None:
    blocks = [KVCacheBlock(i) for i in range(5)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert _ids(queue) == [0, 1, 2, 3, 4]
    queue.popleft()
    queue.remove(blocks[3])
    queue.append(blocks[0])
    assert _ids(queue) == [1, 2, 4, 0]


def test_generate_block_hash_extra_keys() -> None:
    salted = make_request("r", list(range(8)), cache_salt="salt")
    assert block_extra_keys(salted, 0) == ("salt", "salt")
    assert block_extra_keys(salted, 1) is None  # later blocks chain on the salted first one
    assert block_extra_keys(make_request("p", list(range(8))), 0) is None


def test_hash_block_tokens() -> None:
    parent = hash_block_tokens(SHA256, NONE_HASH, [1, 2, 3])
    child = hash_block_tokens(SHA256, parent, [4, 5, 6], ("salt", "x"))
    assert child == hash_block_tokens(SHA256, parent, [4, 5, 6], ("salt", "x"))
    assert child != hash_block_tokens(SHA256, parent, [4, 5, 6])
    assert child != hash_block_tokens(SHA256, NONE_HASH, [4, 5, 6], ("salt", "x"))


def test_request_block_hasher() -> None:
    request = make_request("r", list(range(6)), cache_salt="s")
    update_block_hashes(request, 3, SHA256)
    first = hash_block_tokens(SHA256, NONE_HASH, [0, 1, 2], ("salt", "s"))
    assert request.block_hashes == [first, hash_block_tokens(SHA256, first, [3, 4, 5])]
    request.append_output_token_ids([6, 7])
    update_block_hashes(request, 3, SHA256)
    assert len(request.block_hashes) == 2  # the third block is not full yet
    request.append_output_token_ids([8])
    update_block_hashes(request, 3, SHA256)
    assert len(request.block_hashes) == 3


def test_hash_request_tokens_no_mm_inputs() -> None:
    request = make_request("r", list(range(6)))
    update_block_hashes(request, 3, SHA256)
    assert request.block_hashes[0] == hash_block_tokens(SHA256, NONE_HASH, [0, 1, 2])


@pytest.mark.parametrize("algo", ["sha256", "xxhash"])
def test_hash_fn_is_deterministic(algo: str) -> None:
    fn = get_hash_fn(algo)
    assert fn(b"abc") == fn(b"abc") != fn(b"abd")
    with pytest.raises(ValueError, match="prefix_caching_hash_algo"):
        get_hash_fn("md5")


def _stats(requests: int, queries: int, hits: int) -> PrefixCacheStats:
    return PrefixCacheStats(requests=requests, queries=queries, hits=hits)


def test_metrics() -> None:
    metrics = CachingMetrics(max_recent_requests=5)
    assert metrics.hit_rate == 0.0
    metrics.observe(_stats(1, 20, 9))  # 9/20
    assert metrics.aggregated_requests == 1 and metrics.hit_rate == pytest.approx(0.45)
    metrics.observe(_stats(4, 80, 16))  # 25/100
    assert metrics.aggregated_requests == 5 and metrics.hit_rate == pytest.approx(0.25)
    metrics.observe(_stats(1, 10, 2))  # window of 5: the first interval drops out
    assert metrics.aggregated_requests == 5
    assert (metrics.aggregated_query_total, metrics.aggregated_query_hit) == (90, 18)
    assert metrics.hit_rate == pytest.approx(0.2)
    metrics.observe(_stats(10, 100, 100))  # alone larger than the window: kept anyway
    assert metrics.aggregated_requests == 10 and metrics.hit_rate == 1.0
    metrics.reset()
    assert (metrics.aggregated_requests, metrics.hit_rate, metrics.empty) == (0, 0.0, True)


def test_metrics_empty_stats() -> None:
    metrics = CachingMetrics(max_recent_requests=5)
    metrics.observe(_stats(2, 20, 5))
    metrics.observe(_stats(0, 0, 0))  # nothing happened: history is not pushed out
    assert metrics.aggregated_requests == 2 and metrics.hit_rate == pytest.approx(0.25)


@pytest.mark.parametrize("name", [
    "test_get_kv_cache_config", "test_merge_kv_cache_spec", "test_hash_tokens_different_mm_input",
    "test_estimate_max_model_len",
])
def test_missing_features(name: str) -> None:
    missing = {
        "test_get_kv_cache_config": "per-layer KV cache specs and groups (one pool per layer "
                                    "tensor here)",
        "test_merge_kv_cache_spec": "per-layer KV cache specs",
        "test_hash_tokens_different_mm_input": "multimodal inputs",
        "test_estimate_max_model_len": "max_model_len estimated from the KV budget",
    }
    pytest.skip(f"missing feature: {missing[name]}")
