"""SubscribeKvEvents: while anyone listens, one Engine.KvEvents subscription per engine replica,
fanned out to every subscriber (each gets every batch from the moment it subscribed; each
batch names its engine and its epoch, and seq is consecutive per engine). A replica whose stream
breaks is followed again, resumed from the batch after the last one relayed, so nothing is missed
while the engine still keeps it; otherwise its next batches skip sequence numbers, which tells a
client to resync that engine, and an engine that restarted sends a new epoch (its old blocks are
all gone; seq starts over). An engine without --kv-events ends the subscribers' streams
with FAILED_PRECONDITION naming the flag."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.engine_replicas import EngineReplicas
from strand.services.common.status import StageError
from strand.services.common.subscriber import Subscriber

# A subscriber further behind than this many batches is ended (its client is not reading).
MAX_QUEUED_BATCHES = 10_000


class _ReplicaEvents(Subscriber):
    def __init__(self, feed: KvEventFeed, engines: EngineReplicas, name: str) -> None:
        super().__init__(engines.clients[name])
        self.feed = feed
        self.name = name
        self._resume: tuple[int, str] | None = None  # (seq after the last relayed, its epoch)

    method = "KvEvents"

    def request(self) -> epb.EngineKvEventsRequest:
        if self._resume is None:
            return epb.EngineKvEventsRequest()
        return epb.EngineKvEventsRequest(start_seq=self._resume[0], epoch=self._resume[1])

    async def on_message(self, msg: epb.EngineKvEvents) -> None:
        msg.batch.engine = self.name  # as the router and GetLoads name it
        self._resume = (msg.batch.seq + 1, msg.batch.epoch)
        self.feed.publish(msg.batch)

    def on_lost(self, detail: str, was_subscribed: bool) -> None:
        if detail.startswith("FAILED_PRECONDITION"):
            self.feed.publish(StageError(grpc.StatusCode.FAILED_PRECONDITION,
                                         detail.split(": ", 1)[-1]))


class KvEventFeed:
    def __init__(self, engines: EngineReplicas) -> None:
        self.engines = engines
        self._queues: set[asyncio.Queue[pb.KvEventBatch | StageError]] = set()
        self._replicas: list[_ReplicaEvents] = []

    async def subscribe(self) -> AsyncIterator[pb.KvEventBatch]:
        queue: asyncio.Queue[pb.KvEventBatch | StageError] = asyncio.Queue(MAX_QUEUED_BATCHES)
        self._queues.add(queue)
        if not self._replicas:
            self._replicas = [_ReplicaEvents(self, self.engines, n) for n in self.engines.names]
            for replica in self._replicas:
                replica.start()
        try:
            while True:
                item = await queue.get()
                if isinstance(item, StageError):
                    raise item
                yield item
        finally:
            self._queues.discard(queue)
            if not self._queues:
                await self.close()

    async def close(self) -> None:
        replicas, self._replicas = self._replicas, []
        for replica in replicas:
            await replica.close()

    def publish(self, item: pb.KvEventBatch | StageError) -> None:
        for queue in list(self._queues):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(item)
                continue
            self._queues.discard(queue)
            with contextlib.suppress(asyncio.QueueEmpty):
                queue.get_nowait()
            queue.put_nowait(StageError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                        "KV event subscriber fell too far behind; subscribe "
                                        "again"))
