"""SubscribeKvEvents: one poller of the engine's KV event buffer while anyone listens, fanned
out to every subscriber (each gets every batch from the moment it subscribed)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc

from services._proto.strand.v1 import engine_pb2 as epb
from services._proto.strand.v1 import types_pb2 as pb
from services.common.stage_client import StageClient
from services.common.status import StageError

POLL_S = 0.1
# A subscriber further behind than this many batches is ended (its client is not reading).
MAX_QUEUED_BATCHES = 10_000


class KvEventFeed:
    def __init__(self, engine: StageClient) -> None:
        self.engine = engine
        self._queues: set[asyncio.Queue[pb.KvEventBatch | StageError]] = set()
        self._poller: asyncio.Task[None] | None = None

    async def subscribe(self) -> AsyncIterator[pb.KvEventBatch]:
        queue: asyncio.Queue[pb.KvEventBatch | StageError] = asyncio.Queue(MAX_QUEUED_BATCHES)
        self._queues.add(queue)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.get_running_loop().create_task(self._poll())
        try:
            while True:
                item = await queue.get()
                if isinstance(item, StageError):
                    raise item
                yield item
        finally:
            self._queues.discard(queue)
            if not self._queues and self._poller is not None:
                self._poller.cancel()

    async def _poll(self) -> None:
        while self._queues:
            try:
                resp = await self.engine.call(epb.EngineRequest(
                    take_kv_events=epb.EngineTakeKvEvents()))
            except StageError as exc:
                self._publish(exc)
                return
            for batch in resp.kv_events_batches.batches:
                self._publish(batch)
            await asyncio.sleep(POLL_S)

    def _publish(self, item: pb.KvEventBatch | StageError) -> None:
        for queue in list(self._queues):
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(item)
                continue
            self._queues.discard(queue)
            with contextlib.suppress(asyncio.QueueEmpty):
                queue.get_nowait()
            queue.put_nowait(StageError(grpc.StatusCode.RESOURCE_EXHAUSTED, "KV event subscriber fell too far "
                                                              "behind; subscribe again"))
