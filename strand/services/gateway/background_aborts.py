"""Aborts the gateway sends without a caller waiting (a request dropped as it ends here: its
stream left, its output could not be sent, the engine lost it), each in a task of its own that
is held until done (the event loop keeps only weak references to tasks)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from strand.services.common.status import StageError
from strand.services.gateway.abort_batches import AbortBatches

logger = logging.getLogger(__name__)


class BackgroundAborts:
    def __init__(self, batches: AbortBatches) -> None:
        self.batches = batches  # each abort joins the next message to the detokenizer
        self._tasks: set[asyncio.Task[Any]] = set()

    def abort(self, request_id: str) -> None:
        """Have the detokenizer (and through it the engine) drop the request."""
        self._spawn(self._abort(request_id))

    def abort_when_added(self, add: asyncio.Task[Any], request_id: str,
                         forget: Callable[[str], object]) -> None:
        """The caller gave up while the stages were taking the request: once they have, it
        must not run on unseen, holding KV blocks. forget(request_id) runs once it is gone
        (aborted, or refused by the stages): until then it counts as unfinished."""
        self._spawn(self._abort_when_added(add, request_id, forget))

    async def _abort_when_added(self, add: asyncio.Task[Any], request_id: str,
                                forget: Callable[[str], object]) -> None:
        try:
            try:
                await add
            except StageError:
                return  # it never got in
            await self._abort(request_id)
        finally:
            forget(request_id)

    async def _abort(self, request_id: str) -> None:
        try:
            await self.batches.abort([request_id])
        except StageError as exc:
            logger.warning("abort of %s failed: %s", request_id, exc.message)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
