"""SubscribeKvEvents' resume: per engine, a subscriber gets the kept batches from the seq it asks
for, or a snapshot batch (all blocks cleared, then every cached hash) where the gateway cannot
replay from there; an engine that restarts (a new epoch) sends a snapshot batch to everyone."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, cast

import pytest

from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.engine_replicas import EngineReplicas
from strand.services.common.stage_client import StageClient
from strand.services.gateway.kv_event_feed import KvEventFeed
from strand.services.gateway.kv_event_log import REPLAY_BATCHES, KvEventLog


def stored(seq: int, *hashes: bytes, epoch: str = "e1") -> pb.KvEventBatch:
    batch = pb.KvEventBatch(seq=seq, epoch=epoch)
    batch.events.add(block_stored=pb.BlockStored(block_hashes=list(hashes), block_size=16))
    return batch


def removed(seq: int, *hashes: bytes) -> pb.KvEventBatch:
    batch = pb.KvEventBatch(seq=seq, epoch="e1")
    batch.events.add(block_removed=pb.BlockRemoved(block_hashes=list(hashes)))
    return batch


def snapshot_of(batch: pb.KvEventBatch) -> tuple[bool, int, list[str], list[bytes]]:
    kinds = [e.WhichOneof("kind") for e in batch.events]
    hashes = [h for e in batch.events if e.HasField("block_stored")
              for h in e.block_stored.block_hashes]
    return batch.snapshot, batch.seq, kinds, hashes


# -- KvEventLog -----------------------------------------------------------------------------------

def test_log_replays_the_kept_batches_from_the_seq_asked() -> None:
    log = KvEventLog("engine:0")
    log.reset("e1", [], 5)
    for seq in (5, 6, 7):
        log.append(stored(seq, bytes([seq])))
    assert [b.seq for b in log.opening((6, "e1"))] == [6, 7]
    assert log.opening((8, "e1")) == []  # up to date: nothing to replay


def test_log_sends_a_snapshot_batch_for_another_epoch_or_a_seq_no_longer_kept() -> None:
    log = KvEventLog("engine:0")
    log.reset("e1", [b"a"], 0)
    for seq in range(REPLAY_BATCHES + 2):
        log.append(stored(seq, b"b"))
    log.append(removed(REPLAY_BATCHES + 2, b"a"))
    for resume in [(0, "e1"), (3, "e0"), (REPLAY_BATCHES + 9, "e1"), None]:
        [batch] = log.opening(resume)
        assert snapshot_of(batch) == (True, REPLAY_BATCHES + 3,
                                      ["all_blocks_cleared", "block_stored"], [b"b"])
        assert (batch.engine, batch.epoch) == ("engine:0", "e1")


def test_log_of_an_engine_not_yet_heard_from_opens_with_nothing() -> None:
    assert KvEventLog("engine:0").opening((0, "e1")) == []


# -- KvEventFeed against a scripted engine ------------------------------------------------------

class ScriptedEngine:
    """An engine stage whose KvEvents stream sends what the test puts in `messages`."""

    def __init__(self) -> None:
        self.stage = "engine"
        self.target = "engine:0"
        self.requests: list[epb.EngineKvEventsRequest] = []
        self.messages: asyncio.Queue[epb.EngineKvEvents] = asyncio.Queue()

    async def open_stream(self, method: str, _: Any, request: epb.EngineKvEventsRequest,
                          connect_timeout: float) -> AsyncIterator[epb.EngineKvEvents]:
        self.requests.append(request)
        return self._stream()

    async def _stream(self) -> AsyncIterator[epb.EngineKvEvents]:
        while True:
            yield await self.messages.get()


def subscribed(epoch: str, next_seq: int, *hashes: bytes,
               resumed: bool = False) -> epb.EngineKvEvents:
    return epb.EngineKvEvents(subscribed=True, epoch=epoch, snapshot_next_seq=next_seq,
                              snapshot_block_hashes=list(hashes), resumed=resumed)


async def take(stream: AsyncIterator[pb.KvEventBatch], n: int) -> list[pb.KvEventBatch]:
    return [await asyncio.wait_for(anext(stream), 2.0) for _ in range(n)]


def in_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))
    return run


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine()


@pytest.fixture
def feed(engine: ScriptedEngine) -> KvEventFeed:
    return KvEventFeed(EngineReplicas([cast(StageClient, engine)]))


@in_loop
async def test_feed_opens_with_the_engines_snapshot_then_its_batches(
        engine: ScriptedEngine, feed: KvEventFeed) -> None:
    stream = feed.subscribe()
    engine.messages.put_nowait(subscribed("e1", 4, b"a"))
    engine.messages.put_nowait(epb.EngineKvEvents(batch=stored(4, b"b")))
    first, second = await take(stream, 2)
    assert snapshot_of(first) == (True, 4, ["all_blocks_cleared", "block_stored"], [b"a"])
    assert (second.seq, second.snapshot, second.engine) == (4, False, "engine:0")
    await stream.aclose()


@in_loop
async def test_feed_resumes_a_subscriber_from_its_seq_without_a_snapshot(
        engine: ScriptedEngine, feed: KvEventFeed) -> None:
    first = feed.subscribe()
    engine.messages.put_nowait(subscribed("e1", 0))
    for seq in range(3):
        engine.messages.put_nowait(epb.EngineKvEvents(batch=stored(seq, bytes([seq]))))
    await take(first, 4)
    second = feed.subscribe({"engine:0": (1, "e1")})
    assert [(b.seq, b.snapshot) for b in await take(second, 2)] == [(1, False), (2, False)]
    await second.aclose()
    await first.aclose()


@in_loop
async def test_feed_sends_all_blocks_cleared_when_the_engine_restarts(
        engine: ScriptedEngine, feed: KvEventFeed) -> None:
    stream = feed.subscribe()
    engine.messages.put_nowait(subscribed("e1", 0))
    engine.messages.put_nowait(epb.EngineKvEvents(batch=stored(0, b"a")))
    await take(stream, 2)
    # The engine restarts: its stream, reopened, is a new epoch with an empty cache.
    engine.messages.put_nowait(subscribed("e2", 0))
    engine.messages.put_nowait(epb.EngineKvEvents(batch=stored(0, b"c", epoch="e2")))
    cleared, after = await take(stream, 2)
    assert snapshot_of(cleared) == (True, 0, ["all_blocks_cleared"], [])
    assert (cleared.epoch, after.seq, after.epoch) == ("e2", 0, "e2")
    await stream.aclose()


@in_loop
async def test_feed_follows_the_engine_again_from_where_it_stopped(
        engine: ScriptedEngine, feed: KvEventFeed) -> None:
    stream = feed.subscribe()
    engine.messages.put_nowait(subscribed("e1", 0))
    engine.messages.put_nowait(epb.EngineKvEvents(batch=stored(0, b"a")))
    await take(stream, 2)
    await stream.aclose()  # nobody listens: the engine's stream is closed
    await asyncio.sleep(0)
    stream = feed.subscribe({"engine:0": (1, "e1")})
    engine.messages.put_nowait(subscribed("e1", 1, resumed=True))
    engine.messages.put_nowait(epb.EngineKvEvents(batch=stored(1, b"b")))
    [batch] = await take(stream, 1)
    assert (batch.seq, batch.snapshot) == (1, False)
    assert (engine.requests[-1].start_seq, engine.requests[-1].epoch) == (1, "e1")
    await stream.aclose()
