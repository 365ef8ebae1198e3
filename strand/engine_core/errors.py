"""Errors the engine raises that callers tell apart by type (a service maps each to its status)."""

from __future__ import annotations


class DuplicateRequestError(ValueError):
    """A request id that is already live (vLLM raises ValueError too; this is one)."""


class QueueFullError(RuntimeError):
    """The engine's waiting queue is at max_waiting_requests: try again later (services answer
    RESOURCE_EXHAUSTED)."""


class EngineSleepingError(RuntimeError):
    """add_request while the engine sleeps: wake_up() first (services answer
    FAILED_PRECONDITION)."""


class WorkerFailedError(RuntimeError):
    """A tensor-parallel rank died or stopped answering: the engine cannot step any more (its
    requests end with finish_reason "error"; the message names the rank)."""
