"""Manual mode's SELF_STEP policy carried out (strand/engine_core/step_driver.py decides when): a
Generate stream that no Step call drives steps the engine itself once the clock says so. An idle
engine is not stepped in a busy loop: after a step that left it with nothing to compute, the next
waits for an add."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from strand.engine_core.step_driver import SelfStepClock
from strand.services.common.status import StageError

logger = logging.getLogger(__name__)


class SelfStepper:
    def __init__(self, after: float, has_streams: Callable[[], bool],
                 is_auto: Callable[[], Awaitable[bool]], step_lock: asyncio.Lock,
                 step_once: Callable[[], Awaitable[object]],
                 engine_idle: Callable[[], bool]) -> None:
        self.clock = SelfStepClock(after)
        self._has_streams = has_streams
        self._is_auto = is_auto
        self._step_lock = step_lock
        self._step_once = step_once
        self._engine_idle = engine_idle
        self.work = asyncio.Event()  # set on each add (a stream may need steps now)

    async def run(self) -> None:
        while True:
            try:
                if not self._has_streams() or await self._is_auto():
                    self.work.clear()
                    await self.work.wait()
                    continue
                wait = self.clock.wait_s()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                async with self._step_lock:
                    # Re-checked under the lock: a Step call may have run meanwhile.
                    if not self._has_streams() or self.clock.wait_s() > 0:
                        continue
                    self.work.clear()
                    await self._step_once()
                if self._engine_idle():
                    # Nothing left to compute: stepping again at once would only spin.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.work.wait(), self.clock.after)
            except StageError as exc:
                logger.warning("self-step for Generate streams failed: %s", exc.message)
                await asyncio.sleep(0.2)
            await asyncio.sleep(0)  # let waiting RPCs run between steps
