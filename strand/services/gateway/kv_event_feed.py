"""SubscribeKvEvents: while anyone listens, one Engine.KvEvents subscription per engine replica,
fanned out to every subscriber (each batch names its engine and its epoch, and seq is consecutive
per engine). Per engine, a subscriber first gets the kept batches from where it asked to resume,
or else a snapshot batch (KvEventLog), then every batch as it comes. A replica whose stream
breaks is followed again, resumed from the batch after the last one relayed, so nothing is missed
while the engine still keeps it; where the engine cannot resume (it restarted: a new epoch, seq
starting over), its new snapshot goes to every subscriber as a snapshot batch (all blocks
cleared, then what it caches). An engine without --kv-events ends the subscribers' streams
with FAILED_PRECONDITION naming the flag."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

import grpc

from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.engine_replicas import EngineReplicas
from strand.services.common.status import StageError
from strand.services.common.subscriber import Subscriber
from strand.services.gateway.kv_event_log import KvEventLog

# A subscriber further behind than this many batches is ended (its client is not reading).
MAX_QUEUED_BATCHES = 10_000


class _ReplicaEvents(Subscriber):
    def __init__(self, feed: KvEventFeed, engines: EngineReplicas, name: str) -> None:
        super().__init__(engines.clients[name])
        self.feed = feed
        self.name = name
        self.log = KvEventLog(name)  # kept while nobody listens: a later subscription resumes

    method = "KvEvents"

    def request(self) -> epb.EngineKvEventsRequest:
        if not self.log.known:
            return epb.EngineKvEventsRequest()
        return epb.EngineKvEventsRequest(start_seq=self.log.next_seq, epoch=self.log.epoch)

    def on_subscribed(self, msg: epb.EngineKvEvents) -> None:
        if not msg.resumed:  # the kept batches are no use: the snapshot replaces them
            self.feed.publish(self.log.reset(msg.epoch, list(msg.snapshot_block_hashes),
                                             msg.snapshot_next_seq))

    async def on_message(self, msg: epb.EngineKvEvents) -> None:
        msg.batch.engine = self.name  # as the router and GetLoads name it
        self.log.append(msg.batch)
        self.feed.publish(msg.batch)

    def on_lost(self, detail: str, was_subscribed: bool) -> None:
        if detail.startswith("FAILED_PRECONDITION"):
            self.feed.publish(StageError(grpc.StatusCode.FAILED_PRECONDITION,
                                         detail.split(": ", 1)[-1]))


class KvEventFeed:
    def __init__(self, engines: EngineReplicas) -> None:
        self.engines = engines
        self._queues: set[asyncio.Queue[pb.KvEventBatch | StageError]] = set()
        self._replicas = {n: _ReplicaEvents(self, engines, n) for n in engines.names}
        self._following = False

    async def subscribe(self, resume: dict[str, tuple[int, str]] | None = None
                        ) -> AsyncGenerator[pb.KvEventBatch, None]:
        """resume: per engine, (the seq of the first batch wanted, its epoch)."""
        queue: asyncio.Queue[pb.KvEventBatch | StageError] = asyncio.Queue(MAX_QUEUED_BATCHES)
        # In the same turn as the queue is added: no batch falls between opening and queue.
        self._queues.add(queue)
        opening = [b for name, replica in self._replicas.items()
                   for b in replica.log.opening((resume or {}).get(name))]
        if not self._following:
            self._following = True
            for replica in self._replicas.values():
                replica.start()
        try:
            for batch in opening:
                yield batch
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
        self._following = False
        for replica in self._replicas.values():
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
