"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with an HTTP status."""

from __future__ import annotations

import re
from typing import Any

import grpc
from fastapi.responses import JSONResponse

from strand.services.client import RequestError, ServerUnavailable

# The engine's ValueErrors start with the field they refuse ("temperature must be in [0, 2]",
# "messages[0] must be ...", "structured_outputs.json is invalid"): that name is OpenAI's `param`.
_FIELD = re.compile(r"^([a-z_]+)(?:\.[a-z_]+)?(?:\[\d+\])?[ :]")


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def bad_request(message: str, param: str | None = None) -> OpenAIError:
    if param is None:
        match = _FIELD.match(message)
        param = match.group(1) if match else None
    return OpenAIError(400, message, param=param)


def said_as(error: OpenAIError, name: str) -> OpenAIError:
    """The refusal of a field the front filled in itself, named as the client sent it: its
    param, and the field path its message begins with (`structured_outputs.json is invalid`
    -> `response_format is invalid`)."""
    path = re.match(r"[a-z_]+(?:\.[a-z_]+)*", error.message)
    message = (name + error.message[path.end():]
               if path is not None and path.group(0).split(".")[0] == error.param
               else error.message)
    return OpenAIError(error.status, message, error.type, name, error.code)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(404, f"The model `{model}` does not exist.", param="model",
                       code="model_not_found")


def unavailable(message: str) -> OpenAIError:
    return OpenAIError(503, message, type_="service_unavailable_error",
                       code="service_unavailable")


def from_exception(exc: BaseException) -> OpenAIError:
    """What a client sees for an exception raised while serving its request."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, ServerUnavailable):
        return unavailable(str(exc))
    if isinstance(exc, RequestError | ValueError):
        return bad_request(str(exc))
    if isinstance(exc, grpc.RpcError):
        code = exc.code()  # type: ignore[attr-defined]
        details = str(exc.details())  # type: ignore[attr-defined]
        if code == grpc.StatusCode.UNAVAILABLE:
            return unavailable(f"the strand gateway is unavailable: {details}")
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            # The engine's queue is full (--max-waiting-requests): OpenAI's overload status,
            # which its SDK retries with back-off.
            return OpenAIError(429, details, type_="rate_limit_error",
                               code="rate_limit_exceeded")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return OpenAIError(504, f"the strand gateway did not answer in time: {details}",
                               type_="server_error", code="timeout")
        if code == grpc.StatusCode.FAILED_PRECONDITION:
            # The engine sleeps (Control/Sleep): nothing wrong with the request; retry after
            # WakeUp, as after any 503.
            return unavailable(details)
        return OpenAIError(500, f"gateway error {code.name}: {details}", type_="server_error")
    return OpenAIError(500, f"{type(exc).__name__}: {exc}", type_="server_error")
