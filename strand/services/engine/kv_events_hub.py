"""The engine's KV events for any number of subscribers (Engine.KvEvents).

The core buffers events until they are taken, and a take empties the buffer: two consumers
polling it (the tokenizer's router and the gateway's SubscribeKvEvents) would steal each other's
events. So the engine takes them itself, on the core's thread right after each call that can
change the cache (a step, a reset, a clear), and fans each batch out here. A subscriber starts
from a snapshot of every cached hash; batches older than the snapshot are skipped, so it sees
each change exactly once. One that falls MAX_QUEUED_BATCHES behind is ended (it subscribes again
and gets a fresh snapshot).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from strand.engine_core.core.engine import EngineCore
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.convert_kv_events import kv_event_batch_to_pb

MAX_QUEUED_BATCHES = 10_000


class KvEventsHub:
    def __init__(self, core: EngineCore, name: str) -> None:
        self.core = core
        self.name = name  # how the batches name this engine
        self._queues: set[asyncio.Queue[pb.KvEventBatch | None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def enabled(self) -> bool:
        return self.core.kv_events is not None

    def drain(self, force: bool = False) -> None:
        """On the core's thread: hand the pending events to the subscribers (kept in the core's
        bounded buffer while there are none)."""
        if self.core.kv_events is None or self._loop is None or not (self._queues or force):
            return
        batch = self.core.take_kv_events()
        if batch is not None:
            # The loop is gone only while the server shuts down: nobody is left to tell.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._publish,
                                                kv_event_batch_to_pb(batch, self.name))

    def snapshot(self) -> tuple[list[bytes], int]:
        """On the core's thread: what a new subscriber starts from."""
        self.drain(force=True)
        return self.core.kv_events_snapshot()

    async def stream(self, take_snapshot: Callable[[], Awaitable[tuple[list[bytes], int]]]
                     ) -> AsyncIterator[epb.EngineKvEvents]:
        """A subscription: the snapshot (taken by the caller on the core's thread), then every
        batch after it."""
        self._loop = asyncio.get_running_loop()
        queue: asyncio.Queue[pb.KvEventBatch | None] = asyncio.Queue(MAX_QUEUED_BATCHES)
        self._queues.add(queue)  # before the snapshot: nothing after it can be missed
        try:
            hashes, next_seq = await take_snapshot()
            yield epb.EngineKvEvents(subscribed=True, snapshot_block_hashes=hashes,
                                     snapshot_next_seq=next_seq)
            while True:
                batch = await queue.get()
                if batch is None:
                    return
                if batch.seq >= next_seq:  # older ones are in the snapshot already
                    yield epb.EngineKvEvents(batch=batch)
        finally:
            self._queues.discard(queue)

    def _publish(self, batch: pb.KvEventBatch) -> None:
        for queue in list(self._queues):
            try:
                queue.put_nowait(batch)
            except asyncio.QueueFull:
                # Too far behind: end it (it resubscribes from a snapshot) rather than grow.
                self._queues.discard(queue)
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
                queue.put_nowait(None)
