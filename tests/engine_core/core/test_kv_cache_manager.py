from __future__ import annotations

from strand.engine_core.core.kv_cache_manager import KVCacheManager
from strand.engine_core.core.kv_cache_utils import get_hash_fn, update_block_hashes
from strand.engine_core.core.request import Request
from tests.engine_core.core.conftest import make_request

BS = 4


def _manager(num_blocks: int = 16, enable_caching: bool = True) -> KVCacheManager:
    return KVCacheManager(num_blocks, BS, enable_caching)


def _hashed(req_id: str, prompt: list[int], cache_salt: str | None = None) -> Request:
    request = make_request(req_id, prompt, cache_salt=cache_salt)
    update_block_hashes(request, BS, get_hash_fn("sha256"))
    return request


def _admit(kv: KVCacheManager, request: Request) -> int:
    """Allocate the whole prompt after its prefix hit, as the scheduler would; returns the hit."""
    hits, num_hit = kv.get_computed_blocks(request)
    assert kv.allocate_slots(request, request.num_tokens - num_hit, hits) is not None
    request.num_computed_tokens = request.num_tokens
    return num_hit


def test_shared_prefix_reuses_blocks() -> None:
    kv = _manager()
    a = _hashed("a", list(range(10)))
    _admit(kv, a)
    b = _hashed("b", list(range(8)) + [50, 51, 52])
    assert _admit(kv, b) == 8
    assert kv.get_block_ids("b")[:2] == kv.get_block_ids("a")[:2]
    assert kv.get_block_ids("b")[2] != kv.get_block_ids("a")[2]
    assert [blk.ref_cnt for blk in kv.req_to_blocks["a"][:2]] == [2, 2]


def test_hit_is_capped_so_the_last_prompt_token_is_computed() -> None:
    kv = _manager()
    _admit(kv, _hashed("a", list(range(8))))
    same = _hashed("b", list(range(8)))
    # Both blocks are cached, but a hit on all 8 tokens would leave nothing to compute.
    assert kv.get_computed_blocks(same)[1] == 4


def test_hit_stops_at_the_first_missing_block() -> None:
    kv = _manager()
    _admit(kv, _hashed("a", list(range(12)) + [99]))
    other = _hashed("b", [0, 1, 2, 3, 70, 71, 72, 73, 8, 9, 10, 11, 12])
    assert kv.get_computed_blocks(other)[1] == 4


def test_freed_blocks_still_give_hits() -> None:
    kv = _manager()
    a = _hashed("a", list(range(9)))
    _admit(kv, a)
    kv.free(a)
    assert kv.block_pool.get_num_free_blocks() == 15
    assert _admit(kv, _hashed("b", list(range(9)))) == 8


def test_cache_salt_isolates_tenants() -> None:
    kv = _manager()
    _admit(kv, _hashed("a", list(range(9)), cache_salt="alice"))
    assert kv.get_computed_blocks(_hashed("b", list(range(9)), cache_salt="bob"))[1] == 0
    assert kv.get_computed_blocks(_hashed("c", list(range(9))))[1] == 0
    assert kv.get_computed_blocks(_hashed("d", list(range(9)), cache_salt="alice"))[1] == 8


def test_eviction_takes_least_recently_freed_first_and_a_request_tail_first() -> None:
    kv = _manager(num_blocks=7)  # 6 allocatable
    old = _hashed("old", list(range(13)))  # 3 full blocks + 1 partial
    _admit(kv, old)
    kv.free(old)
    new = _hashed("new", list(range(100, 109)))  # 2 full blocks + 1 partial
    _admit(kv, new)
    kv.free(new)
    _admit(kv, _hashed("x", list(range(200, 217))))  # needs 5 blocks
    # vLLM's order: old's remaining blocks (freed first), then new's tail: its partial block,
    # then its last full block; new keeps its first block.
    assert kv.get_computed_blocks(_hashed("o", list(range(13))))[1] == 0
    assert kv.get_computed_blocks(_hashed("n", list(range(100, 109))))[1] == 4


def test_allocation_failure_changes_nothing() -> None:
    kv = _manager(num_blocks=4)  # 3 allocatable
    big = _hashed("big", list(range(13)))
    hits, _ = kv.get_computed_blocks(big)
    assert kv.allocate_slots(big, 13, hits) is None
    assert kv.block_pool.get_num_free_blocks() == 3
    assert "big" not in kv.req_to_blocks
    assert kv.prefix_cache_stats.requests == 0


def test_reviving_free_hits_counts_against_free_blocks() -> None:
    kv = _manager(num_blocks=4)  # 3 allocatable
    a = _hashed("a", list(range(9)))
    _admit(kv, a)  # 3 blocks
    kv.free(a)
    # 2 hits are free blocks themselves: 2 revived + 2 new > 3 free.
    b = _hashed("b", list(range(8)) + [40, 41, 42, 43, 44])
    hits, num_hit = kv.get_computed_blocks(b)
    assert num_hit == 8
    assert kv.allocate_slots(b, 5, hits) is None
    assert kv.block_pool.get_num_free_blocks() == 3


def test_stats_count_queries_and_hits_and_reset_with_the_cache() -> None:
    kv = _manager()
    a = _hashed("a", list(range(10)))
    _admit(kv, a)
    b = _hashed("b", list(range(10)))
    _admit(kv, b)
    stats = kv.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (2, 20, 8)
    assert stats.hit_rate == 0.4
    assert kv.reset_prefix_cache() is False
    kv.free(a)
    kv.free(b)
    assert kv.reset_prefix_cache() is True
    assert kv.make_prefix_cache_stats().queries == 0
    assert kv.get_computed_blocks(_hashed("c", list(range(10))))[1] == 0


def test_caching_disabled_never_hits() -> None:
    kv = _manager(enable_caching=False)
    _admit(kv, _hashed("a", list(range(10))))
    assert kv.get_computed_blocks(_hashed("b", list(range(10)))) == ([], 0)
    assert kv.block_pool.cached_block_hash_to_block == {}


def test_usage_is_the_held_fraction() -> None:
    kv = _manager(num_blocks=5)
    _admit(kv, _hashed("a", list(range(6))))
    assert kv.usage == 0.5
