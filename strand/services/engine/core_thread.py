"""The core's one thread, shared by the Session calls and the auto-mode step loop.

The step loop runs steps back to back on the thread while nothing else waits for it. Handing each
step's result back to the event loop and the next step to the thread again cost two thread
wake-ups per step (tenths of a millisecond idle, milliseconds on a loaded machine), time an
in-process `LLMEngine` loop never spends. Everything else for the thread (Session calls, stats,
KV snapshots, shutdown) goes through `submit`/`run`, which count it on the way in and again when
it begins, so the step loop can see that something waits and give the thread back after the step
it is in.

Each counter is written by one side only (`_handed` by the event loop, `_begun` by the core's
thread), so the other side reads it without a lock: at worst the thread sees a call one step late.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class CoreThread:
    def __init__(self, executor: ThreadPoolExecutor) -> None:
        self.executor = executor
        self._handed = 0
        self._begun = 0

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Queue fn on the thread (from the event loop's thread), counted."""
        self._handed += 1
        return self.executor.submit(self._begin, fn, *args)

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`submit`, awaitable on the running loop."""
        return asyncio.wrap_future(self.submit(fn, *args))

    def run_step_loop(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """The step loop itself: not counted, it is what the counters are for."""
        return asyncio.wrap_future(self.executor.submit(fn, *args))

    @property
    def others_waiting(self) -> bool:
        """Whether a counted call was handed over and has not begun (read on the thread)."""
        return self._handed != self._begun

    def _begin(self, fn: Callable[..., T], *args: Any) -> T:
        self._begun += 1
        return fn(*args)
