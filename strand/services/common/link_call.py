"""A caller's end of one linked stream, with the surface of a grpc.aio call that StageClient and
Subscriber use: `write`, `read` (grpc.aio.EOF at the end), `async for`, `cancel`. A failure is
a `LinkRpcError`, which is a grpc.aio.AioRpcError: the callers handle one error type whichever
transport the stream took."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from strand.services.common.link_frames import (
    FrameTooLarge,
    Kind,
    json_frame,
    link_address,
    parse_end,
    read_frame,
    write_frame,
)
from strand.services.common.server import KEEPALIVE_TIME_MS
from strand.services.common.stage_protocol import PROTOCOL

# Answers read ahead of the caller; past it the socket is left unread (flow control).
ANSWER_QUEUE = 4096
# How long a PING may go unanswered before the stage is taken for frozen. Longer than gRPC's
# (KEEPALIVE_TIMEOUT_MS): gRPC's own threads answer its pings, the stage's event loop answers
# these, and a loop held for a few seconds (a long call that keeps the GIL) is not a frozen
# stage. A stage that dies is seen at once anyway: its end of the socket closes.
LINK_KEEPALIVE_TIMEOUT_S = 6.0


class LinkRpcError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class LinkCall:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 response_type: Any, max_message_bytes: int) -> None:
        self._reader = reader
        self._writer = writer
        self._parse = response_type.FromString
        self._limit = max_message_bytes
        self._answers: asyncio.Queue[Any] = asyncio.Queue(ANSWER_QUEUE)
        self._ended: LinkRpcError | None = None  # why the stream is over, once it is
        loop = asyncio.get_running_loop()
        self._heard = loop.time()
        self._tasks = (loop.create_task(self._read()), loop.create_task(self._keepalive()))

    @classmethod
    async def open(cls, port: int, method: str, authorization: str | None, response_type: Any,
                   request: Any | None, max_message_bytes: int, timeout: float) -> LinkCall:
        """Connect to the stage on `port` (OSError when it has no link: the caller falls back
        to gRPC) and start `method`, with its one request for a server-streaming method."""
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(link_address(port)), timeout)
        write_frame(writer, Kind.HELLO,
                    json_frame({"method": method, "authorization": authorization or "",
                                "protocol": PROTOCOL}))
        if request is not None:
            write_frame(writer, Kind.MESSAGE, request.SerializeToString())
        return cls(reader, writer, response_type, max_message_bytes)

    def send_now(self, message: Any) -> bool:
        """Write message's frame at once if the socket's buffer is empty (True: it is sent, no
        turn of the loop first); False when bytes still wait there, for `write`, which waits
        for room."""
        if self._ended is not None:
            raise self._ended
        if self._writer.transport.get_write_buffer_size():
            return False
        write_frame(self._writer, Kind.MESSAGE, message.SerializeToString())
        return True

    async def write(self, message: Any) -> None:
        if self._ended is not None:
            raise self._ended
        write_frame(self._writer, Kind.MESSAGE, message.SerializeToString())
        try:
            await self._writer.drain()
        except ConnectionError as exc:
            raise self._end(grpc.StatusCode.UNAVAILABLE, f"link closed: {exc}") from exc

    async def read(self) -> Any:
        """The next answer; grpc.aio.EOF once the stage ended the stream well. A read that is
        cancelled cancels the stream, as grpc.aio's does."""
        if self._answers.empty() and self._ended is not None \
                and self._ended.code() != grpc.StatusCode.OK:
            raise self._ended  # answers that were queued have all been read
        try:
            answer = await self._answers.get()
        except asyncio.CancelledError:
            self.cancel()
            raise
        if isinstance(answer, LinkRpcError):
            raise answer
        if answer is grpc.aio.EOF:
            self._answers.put_nowait(answer)  # every later read says the same
        return answer

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        while (answer := await self.read()) is not grpc.aio.EOF:
            yield answer

    def cancel(self) -> None:
        self._end(grpc.StatusCode.CANCELLED, "cancelled by the caller")

    def _end(self, code: grpc.StatusCode, details: str) -> LinkRpcError:
        """Close the stream (once) for this reason; what readers will be told."""
        if self._ended is None:
            self._ended = LinkRpcError(code, details)
            for task in self._tasks:
                if task is not asyncio.current_task():
                    task.cancel()
            self._writer.close()
            with contextlib.suppress(asyncio.QueueFull):
                self._answers.put_nowait(self._ended)
        return self._ended

    async def _read(self) -> None:
        code, details = grpc.StatusCode.UNAVAILABLE, "the stage closed the link"
        try:
            while True:
                kind, payload = await read_frame(self._reader, self._limit)
                self._heard = asyncio.get_running_loop().time()
                if kind == Kind.MESSAGE:
                    await self._answers.put(self._parse(payload))
                elif kind == Kind.END:
                    code, details = parse_end(payload)
                    break
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            details = f"the stage closed the link ({type(exc).__name__})"
        except FrameTooLarge as exc:
            code, details = grpc.StatusCode.RESOURCE_EXHAUSTED, f"answer too large: {exc}"
        except (DecodeError, ValueError) as exc:
            code, details = grpc.StatusCode.INTERNAL, f"undecodable answer: {exc}"
        if code == grpc.StatusCode.OK:
            await self._answers.put(grpc.aio.EOF)
            self._ended = LinkRpcError(code, "the stream has ended")
            self._writer.close()
            self._tasks[1].cancel()
        else:
            self._end(code, details)

    async def _keepalive(self) -> None:
        """A PING after KEEPALIVE_TIME of silence; the link is given up when nothing at all
        comes back within LINK_KEEPALIVE_TIMEOUT_S (the stage is frozen or its host hung), as
        gRPC's keepalive gives up its connection."""
        loop = asyncio.get_running_loop()
        every, timeout = KEEPALIVE_TIME_MS / 1000, LINK_KEEPALIVE_TIMEOUT_S
        while True:
            await asyncio.sleep(every)
            if loop.time() - self._heard < every or self._answers.full():
                continue  # heard from lately, or it is us not reading
            asked = loop.time()
            write_frame(self._writer, Kind.PING)
            await asyncio.sleep(timeout)
            if self._heard < asked and not self._answers.full():
                self._end(grpc.StatusCode.UNAVAILABLE,
                          f"keepalive ping unanswered for {timeout:.0f}s")
                return
