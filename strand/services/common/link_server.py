"""A stage's link server: the same streaming handlers its gRPC server runs, over a Unix socket
for callers on this host (`stage_link.py` says why).

`LinkRegistry` stands in for the grpc.aio server while the servicers register, so the link
serves exactly the handlers (and their (de)serialisers) gRPC serves; only methods that stream
their answers are linked. A handler runs as it does under gRPC: it is given an iterator of
requests (or the one request) and a context whose `abort` ends the stream with that status;
when the caller goes away the handler is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc

from strand.services.common.link_frames import (
    CONTROL_FRAME_LIMIT,
    FrameTooLarge,
    Kind,
    end_frame,
    link_address,
    read_frame,
    write_frame,
)
from strand.services.common.stage_protocol import protocol_mismatch

logger = logging.getLogger(__name__)

# A caller that connects and says nothing is dropped after this.
HELLO_TIMEOUT_S = 5.0
# Linked streams one stage serves at once; past it a caller is refused RESOURCE_EXHAUSTED (the
# ring needs a handful; gRPC bounds its pending calls the same way).
MAX_STREAMS = 1024
# Requests read ahead of the handler. Past it the socket is left unread, so a caller that
# outruns the stage waits in its writes (gRPC's flow control does the same).
REQUEST_QUEUE = 4096
_END = object()


class LinkAbort(Exception):  # noqa: N818 - the handler's request to end its stream
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class LinkContext:
    """What a stage's streaming handlers use of grpc.aio's ServicerContext."""

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise LinkAbort(code, details)


class LinkRegistry:
    """Wraps the grpc.aio server during registration and keeps each streaming handler."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_registered_method_handlers(self, service: str,
                                       handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        for name, handler in handlers.items():
            if handler.response_streaming:
                self.handlers[f"/{service}/{name}"] = handler
        self._server.add_registered_method_handlers(service, handlers)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class LinkServer:
    def __init__(self, stage: str, handlers: dict[str, grpc.RpcMethodHandler],
                 api_key: str | None, max_message_bytes: int) -> None:
        self.stage = stage
        self._handlers = handlers
        self._authorization = f"Bearer {api_key}" if api_key else None
        self._max_message_bytes = max_message_bytes
        self._server: asyncio.Server | None = None
        self._streams: set[asyncio.Task[None]] = set()

    async def start(self, port: int) -> None:
        """Listen beside TCP `port`. A stage that cannot (the name is taken) is still served
        over gRPC, which its callers fall back to."""
        if not self._handlers:
            return
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=link_address(port))
        except OSError as exc:
            logger.warning("%s: no local link (%s); callers use gRPC", self.stage, exc)

    async def close(self, grace: float = 0.0) -> None:
        """Take no new streams; give those open `grace` seconds to end by themselves (their
        callers are often stopping too), as grpc.aio's stop(grace) does, then cancel them."""
        if self._server is not None:
            self._server.close()
        if self._streams and grace > 0:
            await asyncio.wait(list(self._streams), timeout=grace)
        for task in list(self._streams):
            task.cancel()
        if self._streams:
            await asyncio.gather(*self._streams, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._streams.add(task)
        try:
            handler = await self._hello(reader, writer)
            if handler is not None:
                await _Stream(handler, reader, writer, self._max_message_bytes).run()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the caller went away
        except asyncio.CancelledError:
            pass  # the stage is stopping (close()); asyncio's streams would log it as an error
        finally:
            self._streams.discard(task)
            writer.close()

    async def _hello(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                     ) -> grpc.RpcMethodHandler | None:
        try:
            kind, payload = await asyncio.wait_for(read_frame(reader, CONTROL_FRAME_LIMIT),
                                                   HELLO_TIMEOUT_S)
            hello = json.loads(payload) if kind == Kind.HELLO else None
        except (TimeoutError, FrameTooLarge, ValueError):
            hello = None
        if not isinstance(hello, dict):
            _end(writer, grpc.StatusCode.INVALID_ARGUMENT, "a link stream starts with HELLO")
            return None
        if len(self._streams) > MAX_STREAMS:
            _end(writer, grpc.StatusCode.RESOURCE_EXHAUSTED,
                 f"{self.stage} serves at most {MAX_STREAMS} linked streams")
            return None
        if self._authorization is not None and not hmac.compare_digest(
                str(hello.get("authorization", "")).encode(), self._authorization.encode()):
            _end(writer, grpc.StatusCode.UNAUTHENTICATED,
                 "missing or wrong api key: send metadata 'authorization: Bearer <key>'")
            return None
        error = protocol_mismatch(self.stage, str(hello.get("protocol") or ""))
        if error is not None:
            _end(writer, grpc.StatusCode.FAILED_PRECONDITION, error)
            return None
        handler = self._handlers.get(str(hello.get("method")))
        if handler is None:
            _end(writer, grpc.StatusCode.UNIMPLEMENTED,
                 f"{self.stage} has no streaming method {hello.get('method')!r}")
        return handler


class _Stream:
    """One linked call: the caller's frames in, the handler's answers out."""

    def __init__(self, handler: grpc.RpcMethodHandler, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, max_message_bytes: int) -> None:
        self.handler = handler
        self.reader = reader
        self.writer = writer
        self.limit = max_message_bytes
        self.requests: asyncio.Queue[Any] = asyncio.Queue(REQUEST_QUEUE)

    async def run(self) -> None:
        answering = asyncio.get_running_loop().create_task(self._answer())
        reading = asyncio.get_running_loop().create_task(self._read())
        try:
            done, _ = await asyncio.wait((answering, reading),
                                         return_when=asyncio.FIRST_COMPLETED)
            if answering not in done:
                # The caller hung up (or broke the protocol): cancel the handler, as gRPC
                # cancels a call whose client went away.
                answering.cancel()
            await asyncio.gather(answering, return_exceptions=True)
        finally:
            for task in (answering, reading):
                task.cancel()
            await asyncio.gather(answering, reading, return_exceptions=True)

    async def _read(self) -> None:
        """Until the caller closes: requests to the queue, pings answered at once. A request
        that does not parse or is too large ends the stream, as gRPC ends the call."""
        try:
            while True:
                kind, payload = await read_frame(self.reader, self.limit)
                if kind == Kind.PING:
                    write_frame(self.writer, Kind.PONG)
                elif kind == Kind.MESSAGE:
                    await self.requests.put(self.handler.request_deserializer(payload))
                elif kind == Kind.END:
                    await self.requests.put(_END)  # the caller is done writing
        except FrameTooLarge as exc:
            _end(self.writer, grpc.StatusCode.RESOURCE_EXHAUSTED,
                 f"message too large: {exc} (--max-message-bytes)")
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:  # noqa: BLE001 - protobuf's DecodeError, an unknown frame kind
            _end(self.writer, grpc.StatusCode.INVALID_ARGUMENT, "undecodable request message")

    async def _answer(self) -> None:
        try:
            if self.handler.request_streaming:
                answers = self.handler.stream_stream(self._requests(), LinkContext())
            else:
                request = await self.requests.get()
                if request is _END:
                    raise LinkAbort(grpc.StatusCode.INVALID_ARGUMENT, "no request message")
                answers = self.handler.unary_stream(request, LinkContext())
            serialize: Callable[[Any], bytes] = self.handler.response_serializer
            # Closed on the way out, cancelled or not: a handler's `finally` (the engine
            # dropping a subscriber's requests) must run when its caller goes away.
            async with contextlib.aclosing(answers):
                async for answer in answers:
                    write_frame(self.writer, Kind.MESSAGE, serialize(answer))
                    await self.writer.drain()
            _end(self.writer, grpc.StatusCode.OK)
        except LinkAbort as exc:
            _end(self.writer, exc.code, exc.details)
        except (ConnectionError, asyncio.CancelledError):
            raise
        except Exception as exc:
            logger.exception("linked call failed")
            _end(self.writer, grpc.StatusCode.UNKNOWN, f"Unexpected {type(exc).__name__}: {exc}")
        await _drain_quietly(self.writer)

    async def _requests(self) -> AsyncIterator[Any]:
        while (item := await self.requests.get()) is not _END:
            yield item


def _end(writer: asyncio.StreamWriter, code: grpc.StatusCode, details: str = "") -> None:
    write_frame(writer, Kind.END, end_frame(code, details))


async def _drain_quietly(writer: asyncio.StreamWriter) -> None:
    try:
        await writer.drain()
    except ConnectionError:
        pass
