"""The engine's KV events for any number of subscribers (Engine.KvEvents).

The core buffers events until they are taken, and a take empties the buffer: two consumers
polling it (the tokenizer's router and the gateway's SubscribeKvEvents) would steal each other's
events. So the engine takes them itself, on the core's thread right after each call that can
change the cache (a step, a reset, a clear), and fans each batch out here. A subscriber starts
from a snapshot of every cached hash; batches older than the snapshot are skipped, so it sees
each change exactly once. One that falls MAX_QUEUED_BATCHES behind is ended (it subscribes again
and gets a fresh snapshot).

Resume: the last REPLAY_BATCHES batches are kept, so a subscriber that reconnects with the seq it
expects next (and the epoch it had) gets exactly the batches it missed, with no snapshot. One whose
seq is no longer kept, or from another epoch, gets a snapshot (resumed=false) instead. The epoch
is new at each start of this process: a subscriber that sees it change knows the whole cache it
mirrored is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

from strand.engine_core.core.engine import EngineCore
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.convert_kv_events import kv_event_batch_to_pb

MAX_QUEUED_BATCHES = 10_000
REPLAY_BATCHES = 1_000  # kept for subscribers that resume


class KvEventsHub:
    def __init__(self, core: EngineCore, name: str) -> None:
        self.core = core
        self.name = name  # how the batches name this engine
        self._queues: set[asyncio.Queue[pb.KvEventBatch | None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.epoch = uuid.uuid4().hex  # new each start: the old cache is gone
        self._replay: deque[pb.KvEventBatch] = deque(maxlen=REPLAY_BATCHES)
        self._next_seq = 0  # the seq after the last published batch

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

    def can_resume(self, start_seq: int, epoch: str) -> bool:
        """Whether every batch from start_seq on is still here (or none has come since)."""
        if epoch != self.epoch:
            return False
        return start_seq == self._next_seq or any(b.seq == start_seq for b in self._replay)

    async def stream(self, take_snapshot: Callable[[], Awaitable[tuple[list[bytes], int]]],
                     request: epb.EngineKvEventsRequest | None = None,
                     drain_pending: Callable[[], Awaitable[None]] | None = None
                     ) -> AsyncIterator[epb.EngineKvEvents]:
        """A subscription: the snapshot (taken by the caller on the core's thread), or, for a
        request that can resume, the kept batches from its start_seq; then every batch after."""
        self._loop = asyncio.get_running_loop()
        queue: asyncio.Queue[pb.KvEventBatch | None] = asyncio.Queue(MAX_QUEUED_BATCHES)
        # Registered in the same turn as the replay is read: no batch falls between the two.
        self._queues.add(queue)  # before the snapshot: nothing after it can be missed
        try:
            if (request is not None and request.HasField("start_seq")
                    and self.can_resume(request.start_seq, request.epoch)):
                next_seq = request.start_seq
                missed = [b for b in self._replay if b.seq >= next_seq]
                yield epb.EngineKvEvents(subscribed=True, resumed=True, epoch=self.epoch,
                                         snapshot_next_seq=next_seq)
                for kept in missed:
                    yield epb.EngineKvEvents(batch=kept)
                    next_seq = kept.seq + 1
                if drain_pending is not None:
                    await drain_pending()  # what the core holds untaken comes through the queue
            else:
                hashes, next_seq = await take_snapshot()
                yield epb.EngineKvEvents(subscribed=True, snapshot_block_hashes=hashes,
                                         snapshot_next_seq=next_seq, epoch=self.epoch)
            while True:
                batch = await queue.get()
                if batch is None:
                    return
                if batch.seq >= next_seq:  # older ones are in the snapshot (or replay) already
                    next_seq = batch.seq + 1
                    yield epb.EngineKvEvents(batch=batch)
        finally:
            self._queues.discard(queue)

    def _publish(self, batch: pb.KvEventBatch) -> None:
        batch.epoch = self.epoch
        self._replay.append(batch)
        self._next_seq = batch.seq + 1
        for queue in list(self._queues):
            try:
                queue.put_nowait(batch)
            except asyncio.QueueFull:
                # Too far behind: end it (it resubscribes from a snapshot) rather than grow.
                self._queues.discard(queue)
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
                queue.put_nowait(None)
