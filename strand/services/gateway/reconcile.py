"""A request removed from the engine behind the gateway's back (an abort by another caller of
the engine, a lost message) would leave its client waiting forever: no output will ever come.
While requests are live, the gateway asks the engine every `every` seconds which of the quiet
ones (no output for that long) it no longer holds; a request missing in two checks in a row
(so not one whose final output is merely on its way) ends with finish_reason "error"."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services.common.engine_replicas import EngineReplicas
from strand.services.common.status import StageError
from strand.services.gateway.live import LiveRequest

logger = logging.getLogger(__name__)

RECONCILE_S = 5.0
MAX_IDS_PER_QUERY = 4096  # bounds one query's message; the rest wait for the next round
LOST_REASON = "the engine no longer holds this request"


class Reconciler:
    def __init__(self, engines: EngineReplicas, live: Callable[[], Iterable[LiveRequest]],
                 end_lost: Callable[[list[str]], None], every: float = RECONCILE_S) -> None:
        if not every > 0:
            raise ValueError(f"reconcile interval must be > 0 seconds, got {every}")
        self.engines = engines
        self._live = live
        self._end_lost = end_lost  # ends the given internal ids with "error"
        self.every = every
        self._suspects: set[str] = set()  # missing in the last check

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.every)
            try:
                await self.check()
            except StageError as exc:  # the engine is down: its loss is handled elsewhere
                logger.debug("reconcile skipped: %s", exc.message)

    async def check(self) -> None:
        now = time.monotonic()
        quiet = [live for live in self._live()
                 if live.child_ids and now - live.last_output_at > self.every][:MAX_IDS_PER_QUERY]
        if not quiet:
            self._suspects.clear()
            return
        ids = [c for live in quiet for c in live.child_ids]
        results = await self.engines.fan_out(
            lambda _: epb.EngineRequest(query=epb.EngineQuery(request_ids=ids)))
        answered = [r for r in results.values() if not isinstance(r, StageError)]
        if not answered:
            return
        # Each replica holds its own requests: missing everywhere that answered is missing.
        # (A replica that is down has its requests ended by the detokenizer already.)
        missing = set(answered[0].state.missing_request_ids).intersection(
            *(r.state.missing_request_ids for r in answered[1:]))
        gone = {live.request_id for live in quiet
                if all(c in missing for c in live.child_ids)}
        lost = sorted(gone & self._suspects)
        self._suspects = gone - self._suspects
        if lost:
            logger.warning("%d requests are no longer in the engine; ending them with error",
                           len(lost))
            self._end_lost(lost)
