"""Requests nobody waits for any more: past their caller's deadline (queued or running), or
queued longer than max_queue_time before their first step. EngineCore drops them before it
schedules, so a deadline frees the engine even when no cancel reaches it.

Asked before every step, so it costs little there: deadlines sit in a heap (a step looks at its
top), and only the waiting queue is scanned for the queue-time bound, only when one is set."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from strand.engine_core.core.request import Request

# The abort reasons an expired request's output carries (EngineCoreOutput.stop_reason).
DEADLINE_REASON = "deadline"
QUEUE_TIME_REASON = "queue_time"


class Expiry:
    def __init__(self, max_queue_time: float | None) -> None:
        self.max_queue_time = max_queue_time
        self._deadlines: list[tuple[float, str]] = []  # a heap; ids may have finished since

    def note(self, request_id: str, deadline: float | None) -> None:
        """A request was added (with its deadline, if its caller gave one)."""
        if deadline is not None:
            heapq.heappush(self._deadlines, (deadline, request_id))

    def due(self, requests: Mapping[str, Request], waiting: Iterable[Request],
            now: float) -> list[tuple[str, str]]:
        """(request id, reason) of each request to drop at time.time() == now."""
        out: list[tuple[str, str]] = []
        while self._deadlines and self._deadlines[0][0] <= now:
            deadline, request_id = heapq.heappop(self._deadlines)
            request = requests.get(request_id)
            # The id may have finished, or been reused by a request with its own deadline.
            if request is not None and request.deadline == deadline:
                out.append((request_id, DEADLINE_REASON))
        if self.max_queue_time is not None:
            late = {rid for rid, _ in out}
            out += [(r.request_id, QUEUE_TIME_REASON) for r in waiting
                    if r.first_scheduled_time is None and r.request_id not in late
                    and now - r.arrival_time > self.max_queue_time]
        return out
