"""Requests nobody waits for any more: past their caller's deadline (queued or running), or
queued longer than max_queue_time before their first step. EngineCore drops them before it
schedules, so a deadline frees the engine even when no cancel reaches it."""

from __future__ import annotations

from collections.abc import Iterable

from strand.engine_core.core.request import Request

# The abort reasons an expired request's output carries (EngineCoreOutput.stop_reason).
DEADLINE_REASON = "deadline"
QUEUE_TIME_REASON = "queue_time"


def expired_requests(requests: Iterable[Request], now: float,
                     max_queue_time: float | None) -> list[tuple[str, str]]:
    """(request id, reason) of each request to drop at time.time() == now."""
    out: list[tuple[str, str]] = []
    for request in requests:
        if request.deadline is not None and request.deadline <= now:
            out.append((request.request_id, DEADLINE_REASON))
        elif (max_queue_time is not None and request.first_scheduled_time is None
              and now - request.arrival_time > max_queue_time):
            out.append((request.request_id, QUEUE_TIME_REASON))
    return out
