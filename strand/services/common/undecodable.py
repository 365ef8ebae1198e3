"""A request message that does not decode (random bytes, another message type, a truncated
body) is the caller's mistake: INVALID_ARGUMENT naming the method, and one log line per client
per minute however many come (gRPC's own answer is UNKNOWN with a traceback each)."""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

logger = logging.getLogger(__name__)

LOG_EVERY_S = 60.0
_MAX_CLIENTS_REMEMBERED = 1024
_OPEN_METHODS = ("/grpc.health.v1.", "/grpc.reflection.")


class _Undecodable:
    """What the tolerant deserializer hands on instead of a message."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class RateLimitedLog:
    """One warning per key per `every` seconds, with how many were held back since."""

    def __init__(self, every: float = LOG_EVERY_S) -> None:
        self.every = every
        self._last: dict[str, tuple[float, int]] = {}  # key -> (when logged, held back since)

    def warn(self, key: str, message: str) -> bool:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last[0] < self.every:
            self._last[key] = (last[0], last[1] + 1)
            return False
        held = f" ({last[1]} more since the last line)" if last and last[1] else ""
        logger.warning("%s%s", message, held)
        if len(self._last) >= _MAX_CLIENTS_REMEMBERED:  # forget the quiet ones
            self._last = {k: v for k, v in self._last.items() if now - v[0] < self.every}
        self._last[key] = (now, 0)
        return True


class UndecodableInterceptor(grpc.aio.ServerInterceptor):
    """Unary-request methods get a deserializer that never raises; an undecodable message is
    answered INVALID_ARGUMENT before the servicer sees it."""

    def __init__(self, log: RateLimitedLog | None = None) -> None:
        self.log = log or RateLimitedLog()

    async def intercept_service(self, continuation: Callable[..., Awaitable[grpc.RpcMethodHandler]],
                                details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        method: str = details.method  # type: ignore[attr-defined]
        if (handler is None or handler.request_streaming or handler.request_deserializer is None
                or method.startswith(_OPEN_METHODS)):
            return handler
        return self._tolerant(handler, method)

    def _tolerant(self, handler: grpc.RpcMethodHandler, method: str) -> grpc.RpcMethodHandler:
        decode = handler.request_deserializer

        def deserialize(data: bytes) -> Any:
            try:
                return decode(data)
            except Exception as exc:  # noqa: BLE001 - any decoding failure is the caller's
                return _Undecodable(f"{type(exc).__name__}: {str(exc)[:200]}")

        async def refuse(request: _Undecodable, context: grpc.aio.ServicerContext) -> None:
            peer = context.peer() or "unknown"
            client = peer.rsplit(":", 1)[0]  # per client host, not per connection
            self.log.warn(client, f"undecodable {method} request from {peer}: {request.reason}")
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"the request message does not decode as {method}'s request "
                                f"type")

        if handler.response_streaming:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext
                             ) -> AsyncIterator[Any]:
                if isinstance(request, _Undecodable):
                    await refuse(request, context)
                result = inner_stream(request, context)
                if inspect.isasyncgen(result):
                    async for item in result:
                        yield item
                else:
                    await result

            return grpc.unary_stream_rpc_method_handler(
                stream, request_deserializer=deserialize,
                response_serializer=handler.response_serializer)

        inner = handler.unary_unary

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, _Undecodable):
                await refuse(request, context)
            return await inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary, request_deserializer=deserialize,
            response_serializer=handler.response_serializer)
