"""Exceptions from the pure objects map to the gRPC codes the issue names."""

from __future__ import annotations

import grpc

from strand.engine_core.errors import DuplicateRequestError
from strand.services.common.status import (
    StageUnavailable,
    error_from_pb,
    error_to_pb,
    status_of,
)


def test_value_error_is_invalid_argument_with_its_message() -> None:
    assert status_of(ValueError("top_p must be in (0, 1], got 2.0")) == (
        grpc.StatusCode.INVALID_ARGUMENT, "top_p must be in (0, 1], got 2.0")


def test_reused_request_id_is_already_exists_by_type_not_by_wording() -> None:
    code, _ = status_of(DuplicateRequestError("request_id 'a' was seen"))
    assert code == grpc.StatusCode.ALREADY_EXISTS
    # A plain ValueError that happens to use the words stays INVALID_ARGUMENT.
    code, _ = status_of(ValueError("stop string 'already in use' is too long"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_unavailable_stage_is_named() -> None:
    code, message = status_of(StageUnavailable("engine", "connection refused"))
    assert code == grpc.StatusCode.UNAVAILABLE
    assert message == "engine stage is unavailable: connection refused"


def test_unexpected_exception_is_internal_with_its_type() -> None:
    code, message = status_of(RuntimeError("boom"))
    assert (code, message) == (grpc.StatusCode.INTERNAL, "RuntimeError: boom")


def test_stage_error_survives_the_stream_message() -> None:
    err = error_from_pb(error_to_pb(ValueError("n must be >= 1, got 0")))
    assert (err.code, err.message) == (grpc.StatusCode.INVALID_ARGUMENT, "n must be >= 1, got 0")
