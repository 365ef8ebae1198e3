"""Errors across services: Python exceptions <-> gRPC status codes <-> in-stream StageError."""

from __future__ import annotations

import grpc

from strand.engine_core.errors import DuplicateRequestError, EngineSleepingError, QueueFullError
from strand.services._proto.strand.v1 import types_pb2 as pb

# A draining server's refusal (the gateway's UNAVAILABLE, the OpenAI front's 503).
DRAINING_MESSAGE = ("the server is draining (shutting down): it takes no new requests; "
                    "send them to another replica")


class StageError(Exception):
    """A failed call to a stage (or the gateway): a gRPC status code and a message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class StageUnavailable(StageError):
    """The stage's process is down or unreachable; the message names the stage."""

    def __init__(self, stage: str, detail: str = "") -> None:
        suffix = f": {detail}" if detail else ""
        super().__init__(grpc.StatusCode.UNAVAILABLE, f"{stage} stage is unavailable{suffix}")
        self.stage = stage


_CODES_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status a servicer answers for an exception from the pure objects."""
    if isinstance(exc, StageError):
        return exc.code, exc.message
    if isinstance(exc, QueueFullError):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc)
    if isinstance(exc, EngineSleepingError):
        # The request is fine; the engine is not in a state to take it until WakeUp.
        return grpc.StatusCode.FAILED_PRECONDITION, str(exc)
    if isinstance(exc, ValueError):
        code = (grpc.StatusCode.ALREADY_EXISTS if isinstance(exc, DuplicateRequestError)
                else grpc.StatusCode.INVALID_ARGUMENT)
        return code, str(exc)
    return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}"


def error_to_pb(exc: BaseException) -> pb.StageError:
    code, message = status_of(exc)
    return pb.StageError(code=code.value[0], message=message)


def error_from_pb(msg: pb.StageError) -> StageError:
    return StageError(_CODES_BY_VALUE.get(msg.code, grpc.StatusCode.UNKNOWN), msg.message)
