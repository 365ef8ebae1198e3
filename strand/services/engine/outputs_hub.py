"""The engine's one output subscription (the detokenizer's): each step's outputs, in order.

The queue is short: in auto mode the engine runs at most `max_pending` steps ahead of the
detokenizer, so a slow detokenizer slows the engine instead of growing memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable

from strand.services._proto.strand.v1 import engine_pb2 as epb

MAX_PENDING_STEPS = 2


class Subscription:
    def __init__(self, max_pending: int) -> None:
        self.queue: asyncio.Queue[epb.EngineStepOutputs | None] = asyncio.Queue(max_pending)
        self.closed = False

    def close(self) -> None:
        self.closed = True
        # Emptied so a put blocked on a full queue wakes (and finds it closed), then the
        # None ends the stream of a subscriber that is still reading.
        while not self.queue.empty():
            self.queue.get_nowait()
        self.queue.put_nowait(None)


class OutputsHub:
    def __init__(self, on_lost: Callable[[], None],
                 max_pending: int = MAX_PENDING_STEPS) -> None:
        self._on_lost = on_lost  # every request in the engine is aborted: nobody reads its tokens
        self._max_pending = max_pending
        self._current: Subscription | None = None
        self.changed = asyncio.Event()  # set on subscribe (the auto loop waits for a reader)

    @property
    def active(self) -> bool:
        return self._current is not None

    async def put(self, msg: epb.EngineStepOutputs) -> bool:
        """Queue one step's outputs; False when no subscriber took them (they are lost, and so
        is every request: on_lost has aborted them)."""
        sub = self._current
        if sub is None:
            return False
        await sub.queue.put(msg)
        return not sub.closed

    def offer(self, msg: epb.EngineStepOutputs) -> bool:
        """Queue one step's outputs if there is room now (True); False when a put must wait.
        With no subscriber they are taken and lost, as `put` loses them."""
        sub = self._current
        if sub is not None:
            if sub.queue.full():
                return False
            sub.queue.put_nowait(msg)
        return True

    async def stream(self) -> AsyncGenerator[epb.EngineStepOutputs, None]:
        """A new subscription (ending the previous one), for as long as the caller reads."""
        if self._current is not None:
            self._end(self._current)
        sub = Subscription(self._max_pending)
        self._current = sub
        self.changed.set()
        try:
            yield epb.EngineStepOutputs(subscribed=True)
            while True:
                msg = await sub.queue.get()
                if msg is None:
                    return
                yield msg
        finally:
            if self._current is sub:
                self._end(sub)

    def _end(self, sub: Subscription) -> None:
        if self._current is sub:
            self._current = None
        sub.close()
        self._on_lost()
