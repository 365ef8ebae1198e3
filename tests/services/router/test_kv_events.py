"""KV events from the real scheduler's block pool: stores, prefix hits, eviction, reset, overflow."""

from __future__ import annotations

import weakref
from pathlib import Path

import pytest

from strand.engine_core import EngineArgs, SamplingParams
from strand.engine_core.core.engine import EngineCore
from strand.engine_core.core.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEvent,
    KVEventBatch,
    KVEventBuffer,
)
from strand.engine_core.core.scheduler import Scheduler
from tests.engine_core.core.conftest import FakeRunner, make_request, make_scheduler
from tests.engine_core.core.conftest import run_to_completion as _run_with
from tests.engine_core.engine.conftest import make_engine

BS = 4


def _events(scheduler: Scheduler) -> list[KVEvent]:
    buf = scheduler.kv_cache_manager.block_pool.kv_events
    assert buf is not None
    batch = buf.take()
    return [] if batch is None else batch.events


_RUNNERS: weakref.WeakKeyDictionary[Scheduler, FakeRunner] = weakref.WeakKeyDictionary()


def run_to_completion(scheduler: Scheduler) -> None:
    """One runner per scheduler: its KV survives between requests, so prefix hits check out."""
    runner = _RUNNERS.setdefault(scheduler, FakeRunner(scheduler))
    _run_with(scheduler, runner)


def _enabled(num_blocks: int = 64) -> Scheduler:
    scheduler = make_scheduler(num_blocks=num_blocks, block_size=BS)
    scheduler.kv_cache_manager.block_pool.enable_kv_events(BS)
    return scheduler


def test_prompt_blocks_stored_with_chain_and_tokens() -> None:
    scheduler = _enabled()
    req = make_request("a", list(range(10, 20)), max_tokens=1)  # 10 tokens: 2 full blocks
    scheduler.add_request(req)
    run_to_completion(scheduler)
    stored = [e for e in _events(scheduler) if isinstance(e, BlockStored)]
    assert len(stored) == 1
    assert stored[0].block_hashes == req.block_hashes[:2]
    assert stored[0].parent_block_hash is None
    assert stored[0].token_ids == list(range(10, 18))
    assert stored[0].block_size == BS


def test_prefix_hit_stores_only_the_new_tail() -> None:
    scheduler = _enabled()
    shared = list(range(100, 108))  # 2 shared blocks
    a = make_request("a", shared + [1, 2, 3, 4], max_tokens=1)
    scheduler.add_request(a)
    run_to_completion(scheduler)
    _events(scheduler)
    b = make_request("b", shared + [5, 6, 7, 8], max_tokens=1)
    scheduler.add_request(b)
    run_to_completion(scheduler)
    events = _events(scheduler)
    assert events == [BlockStored([b.block_hashes[2]], b.block_hashes[1], [5, 6, 7, 8], BS)]
    # The shared blocks chain identically: the router can match them by hash.
    assert a.block_hashes[:2] == b.block_hashes[:2]


def test_eviction_emits_removed() -> None:
    scheduler = _enabled(num_blocks=5)  # 4 usable blocks
    a = make_request("a", list(range(16)), max_tokens=1)  # 4 full blocks
    scheduler.add_request(a)
    run_to_completion(scheduler)
    _events(scheduler)
    b = make_request("b", list(range(200, 208)), max_tokens=1)  # needs blocks: evicts a's
    scheduler.add_request(b)
    run_to_completion(scheduler)
    events = _events(scheduler)
    removed = [h for e in events if isinstance(e, BlockRemoved) for h in e.block_hashes]
    assert removed and set(removed) <= set(a.block_hashes)
    stored = [h for e in events if isinstance(e, BlockStored) for h in e.block_hashes]
    assert stored == b.block_hashes[:2]
    # What stays cached is exactly a's hashes minus the removed ones, plus b's.
    table = scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block
    assert {h for h, _ in table.items()} == (set(a.block_hashes[:4]) - set(removed)) | set(stored)


def test_reset_emits_all_cleared() -> None:
    scheduler = _enabled()
    scheduler.add_request(make_request("a", list(range(8)), max_tokens=1))
    run_to_completion(scheduler)
    _events(scheduler)
    assert scheduler.reset_prefix_cache()
    assert _events(scheduler) == [AllBlocksCleared()]


def test_disabled_records_nothing() -> None:
    scheduler = make_scheduler(block_size=BS)
    scheduler.add_request(make_request("a", list(range(8)), max_tokens=1))
    run_to_completion(scheduler)
    assert scheduler.kv_cache_manager.block_pool.kv_events is None


def test_buffer_overflow_drops_oldest_and_skips_seq() -> None:
    buf = KVEventBuffer(max_events=2)
    buf.record(BlockRemoved([b"1"]))
    assert buf.take() == buf_batch(0, [BlockRemoved([b"1"])])
    for h in (b"2", b"3", b"4", b"5"):
        buf.record(BlockRemoved([h]))
    batch = buf.take()
    assert batch is not None
    assert batch.dropped == 2 and batch.seq == 3  # 1 expected, 2 numbers lost
    assert batch.events == [BlockRemoved([b"4"]), BlockRemoved([b"5"])]
    assert buf.take() is None
    buf.record(AllBlocksCleared())
    nxt = buf.take()
    assert nxt is not None and nxt.seq == 4
    with pytest.raises(ValueError, match="kv_events_max_buffer"):
        KVEventBuffer(0)


def buf_batch(seq: int, events: list[KVEvent]) -> KVEventBatch:
    return KVEventBatch(seq=seq, events=events)


def test_engine_core_take_kv_events(tiny_model_dir: Path) -> None:
    engine = make_engine(tiny_model_dir, block_size=4, kv_events=True)
    core: EngineCore = engine.engine_core
    assert core.take_kv_events() is None
    engine.add_request("r", {"prompt_token_ids": list(range(1, 13))},
                       SamplingParams(max_tokens=2, temperature=0.0))
    for _ in range(20):
        if not engine.has_unfinished_requests():
            break
        engine.step()
    first = core.take_kv_events()
    assert first is not None and first.seq == 0
    assert [h for e in first.events if isinstance(e, BlockStored) for h in e.block_hashes]
    assert engine.reset_prefix_cache()
    second = core.take_kv_events()
    assert second is not None and second.seq == 1 and second.events == [AllBlocksCleared()]
    plain = make_engine(tiny_model_dir, block_size=4)
    with pytest.raises(ValueError, match="kv_events"):
        plain.engine_core.take_kv_events()
    assert EngineArgs(kv_events=True).kv_events
