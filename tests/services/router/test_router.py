"""The router library: index fed by KV events, kv-aware / least-load / round-robin, health."""

from __future__ import annotations

import pytest

from strand.engine_core.core.kv_cache_utils import get_hash_fn, update_block_hashes
from strand.engine_core.core.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
)
from strand.engine_core.lora.request import LoRARequest
from strand.services.router import KVIndex, ReplicaLoad, Router, prompt_block_hashes
from tests.engine_core.core.conftest import make_request

BS = 4
SYSTEM = list(range(100, 132))  # 8 blocks shared by every "chat" request


def stored(hashes: list[bytes], seq: int) -> KVEventBatch:
    return KVEventBatch(seq=seq, events=[BlockStored(hashes, None, [], BS)])


def test_hashes_equal_the_engines() -> None:
    req = make_request("x", list(range(10)), cache_salt="t1")
    update_block_hashes(req, BS, get_hash_fn("sha256"))
    assert prompt_block_hashes(list(range(10)), BS, cache_salt="t1") == req.block_hashes
    assert prompt_block_hashes(list(range(10)), BS) != req.block_hashes  # the salt counts


def test_hashes_with_an_adapter_equal_the_engines() -> None:
    """The engine keys a request's first block by its LoRA adapter id (after the salt): the
    router's hashes must too, or a prompt run with another adapter looks cached."""
    req = make_request("x", list(range(10)), cache_salt="t1")
    req.lora_request = LoRARequest("a", 7, "/adapters/a")
    update_block_hashes(req, BS, get_hash_fn("sha256"))
    assert prompt_block_hashes(list(range(10)), BS, cache_salt="t1",
                               lora_int_id=7) == req.block_hashes
    assert prompt_block_hashes(list(range(10)), BS, cache_salt="t1",
                               lora_int_id=8) != req.block_hashes
    assert prompt_block_hashes(list(range(10)), BS, cache_salt="t1") != req.block_hashes


def test_same_prompt_with_another_adapter_is_no_prefix_hit() -> None:
    router = Router(["a", "b"], BS)
    # b cached the system prompt run with adapter 1 (the hashes its events carry).
    req = make_request("x", SYSTEM)
    req.lora_request = LoRARequest("one", 1, "/adapters/one")
    update_block_hashes(req, BS, get_hash_fn("sha256"))
    router.apply_events("b", stored(req.block_hashes, seq=0))
    router.update_load("a", ReplicaLoad(running=1, free_blocks=90, total_blocks=100))
    router.update_load("b", ReplicaLoad(running=2, free_blocks=80, total_blocks=100))
    assert router.cached_blocks("b", SYSTEM, lora_int_id=1) == 8
    assert router.cached_blocks("b", SYSTEM, lora_int_id=2) == 0
    assert router.cached_blocks("b", SYSTEM) == 0  # the base model shares nothing either
    # Adapter 2 on b would recompute every block: the idler a takes it; adapter 1 follows b.
    assert router.route(SYSTEM + [1, 2], lora_int_id=2) == "a"
    assert router.route(SYSTEM + [3, 4], lora_int_id=1) == "b"


def test_shared_long_prefix_routes_to_the_replica_that_cached_it() -> None:
    router = Router(["a", "b"], BS)
    assert router.policy == "kv-aware"
    router.apply_events("b", stored(prompt_block_hashes(SYSTEM, BS), seq=0))
    # b is somewhat busier, but holds the whole 8-block prefix.
    router.update_load("a", ReplicaLoad(running=1, free_blocks=90, total_blocks=100))
    router.update_load("b", ReplicaLoad(running=2, free_blocks=80, total_blocks=100))
    assert router.route(SYSTEM + [1, 2, 3, 4, 5]) == "b"
    assert router.cached_blocks("b", SYSTEM + [9]) == 8
    assert router.cached_blocks("a", SYSTEM + [9]) == 0


def test_distinct_prefixes_spread_by_load() -> None:
    router = Router(["a", "b", "c"], BS)
    chosen = [router.route([i * 50 + j for j in range(16)]) for i in range(6)]
    assert sorted(chosen) == ["a", "a", "b", "b", "c", "c"]


def test_hot_prefix_does_not_pile_onto_one_replica() -> None:
    router = Router(["a", "b"], BS, balance_abs_threshold=2, balance_rel_threshold=2.0)
    router.apply_events("a", stored(prompt_block_hashes(SYSTEM, BS), seq=0))
    chosen = [router.route(SYSTEM + [i]) for i in range(10)]
    assert chosen[0] == "a" and "b" in chosen


def test_sequence_gap_triggers_resync() -> None:
    resynced: list[str] = []
    index = KVIndex(on_resync=resynced.append)
    index.add_replica("a")
    h = prompt_block_hashes(SYSTEM, BS)
    index.apply("a", stored(h[:4], seq=0))
    index.apply("a", KVEventBatch(seq=1, events=[BlockRemoved([h[3]])]))
    assert index.prefix_match("a", h) == 3 and resynced == []
    index.apply("a", stored(h[4:], seq=3))  # seq 2 was lost
    assert resynced == ["a"] and index.blocks("a") == set()
    index.load_snapshot("a", h[:2], next_seq=4)
    index.apply("a", stored(h[2:3], seq=4))
    assert index.prefix_match("a", h) == 3 and resynced == ["a"]
    index.apply("a", KVEventBatch(seq=6, events=[], dropped=1))  # overflow on the engine
    assert resynced == ["a", "a"]


def test_all_blocks_cleared_triggers_resync() -> None:
    resynced: list[str] = []
    router = Router(["a", "b"], BS, on_resync=resynced.append)
    h = prompt_block_hashes(SYSTEM, BS)
    router.apply_events("a", stored(h, seq=0))
    router.apply_events("a", KVEventBatch(seq=1, events=[AllBlocksCleared()]))
    assert resynced == ["a"] and router.cached_blocks("a", SYSTEM) == 0


def test_removed_replica_never_chosen_and_readded() -> None:
    for policy in ("kv-aware", "least-load", "round-robin"):
        router = Router(["a", "b"], BS, policy=policy)
        router.apply_events("a", stored(prompt_block_hashes(SYSTEM, BS), seq=0))
        router.remove_replica("a")
        assert {router.route(SYSTEM + [i]) for i in range(6)} == {"b"}
        router.add_replica("a")
        assert router.cached_blocks("a", SYSTEM) == 0  # its old entries are gone
        assert "a" in {router.route([i * 40 + j for j in range(8)]) for i in range(6)}
        router.remove_replica("a")
        router.remove_replica("b")
        with pytest.raises(ValueError, match="replicas"):
            router.route(SYSTEM)


def test_round_robin_and_least_load() -> None:
    rr = Router(["a", "b"], BS, policy="round-robin")
    assert [rr.route([1]) for _ in range(4)] == ["a", "b", "a", "b"]
    ll = Router(["a", "b"], BS, policy="least-load")
    ll.update_load("a", ReplicaLoad(running=3, waiting=1))
    ll.update_load("b", ReplicaLoad(running=1))
    assert [ll.route([1]) for _ in range(4)] == ["b", "b", "b", "a"]
    assert Router(["only"], BS).policy == "round-robin"
    with pytest.raises(ValueError, match="policy"):
        Router(["a"], BS, policy="random")
    with pytest.raises(ValueError, match="block_size"):
        Router(["a"], 0)
