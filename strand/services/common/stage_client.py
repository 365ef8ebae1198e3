"""One long-lived bidirectional stream to a stage, with answers matched to calls by `seq`, and
the stage's other streams (`open_stream`), each over the local link when the stage is on this
host (`stage_link.py`), else over gRPC.

When the stream breaks (the stage died, or froze: the channel's keepalive pings go unanswered),
every pending call fails with UNAVAILABLE naming the stage, `on_lost` is told, and the next call
opens a fresh stream (the stage may be back by then). A call that gets no answer within its
deadline fails with DEADLINE_EXCEEDED naming the stage.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from strand.services.common.link_call import LinkCall
from strand.services.common.server import (
    DEFAULT_MAX_MESSAGE_BYTES,
    channel_options,
    keepalive_channel_options,
)
from strand.services.common.stage_auth import stage_metadata
from strand.services.common.stage_link import link_port, stream_method
from strand.services.common.status import StageError, StageUnavailable, error_from_pb

logger = logging.getLogger(__name__)

# Reconnect fast: a restarted stage should be usable within a second, not after minutes of backoff.
_RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100),
                      ("grpc.min_reconnect_backoff_ms", 100),
                      ("grpc.max_reconnect_backoff_ms", 1000)]
# No stage call may wait forever: past this the caller gets DEADLINE_EXCEEDED (generous: one
# manual step of a large batch on a slow CPU takes tens of seconds).
CALL_TIMEOUT_S = 120.0


@dataclass(slots=True)
class _Started:
    """A call past its first, immediate part (StageClient._start)."""

    msg: Any
    future: asyncio.Future[Any] | None  # None: refused before it was sent (error says why)
    write: asyncio.Task[None] | None  # the write still to come, when it could not go at once
    error: BaseException | None  # why it cannot be sent


class StageClient:
    def __init__(self, stage: str, target: str, stub_factory: Callable[[grpc.aio.Channel], Any],
                 on_lost: Callable[[StageUnavailable], Awaitable[None]] | None = None,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 connect_timeout: float = 1.0, call_timeout: float = CALL_TIMEOUT_S) -> None:
        self.stage = stage
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self.target = target
        self.max_message_bytes = max_message_bytes
        self._link_port = link_port(target)
        self.channel = grpc.aio.insecure_channel(
            target, options=[*channel_options(max_message_bytes), *_RECONNECT_OPTIONS,
                             *keepalive_channel_options()])
        self.stub = stub_factory(self.channel)
        self.on_lost = on_lost
        self._call: Any = None
        self._writes_waiting = 0  # write tasks not yet done: later messages queue behind them
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._seq = itertools.count(1)
        self._write_lock = asyncio.Lock()
        self._closing = False

    async def call(self, msg: Any) -> Any:
        """Send msg (its seq is set here) and await the matching answer; StageError on error."""
        return await self._answer(self._start(msg))

    def send(self, msg: Any) -> asyncio.Task[Any]:
        """`call` as a task, for a caller that runs it beside other work: the frame is written
        in this turn where the link lets it (a task's own first turn comes later), the answer
        awaited in the task. Errors come out of the task."""
        return asyncio.get_running_loop().create_task(self._answer(self._start(msg)))

    def _start(self, msg: Any) -> _Started:
        """The part of a call that runs at once: its seq, its answer's future, its frame written
        or its write task made (in order behind any earlier one). Raises nothing."""
        if self._closing:
            return _Started(msg, None, None, StageUnavailable(self.stage,
                                                              "this stage is shutting down"))
        msg.seq = next(self._seq)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[msg.seq] = future
        try:
            if self._send_now(msg):
                return _Started(msg, future, None, None)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError) as exc:
            return _Started(msg, future, None, exc)
        # The write runs in a task of its own, shielded: a caller cancelled mid-write (a client
        # that hung up) must not cancel the write, which would make grpc.aio cancel the whole
        # shared stream and fail every other request on it. The message is then sent anyway.
        self._writes_waiting += 1
        write = asyncio.get_running_loop().create_task(self._write(msg))
        return _Started(msg, future, write, None)

    async def _answer(self, started: _Started) -> Any:
        seq, future = started.msg.seq, started.future
        if future is None:
            assert started.error is not None
            raise started.error
        try:
            if started.error is not None:
                raise started.error
            if started.write is not None:
                await asyncio.shield(started.write)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
            self._pending.pop(seq, None)
            raise StageUnavailable(self.stage, _detail(exc)) from exc
        except BaseException:
            self._pending.pop(seq, None)
            raise
        try:
            resp = await asyncio.wait_for(future, self.call_timeout)
        except TimeoutError as exc:
            self._pending.pop(seq, None)
            raise StageError(grpc.StatusCode.DEADLINE_EXCEEDED,
                             f"{self.stage} stage did not answer within "
                             f"{self.call_timeout:.0f}s") from exc
        if resp.HasField("error"):
            raise error_from_pb(resp.error)
        return resp

    def _send_now(self, msg: Any) -> bool:
        """A linked stream's frame written in the caller's turn when no earlier write waits and
        the socket has room: the write task's own turn of the loop came first on the way to
        every request's first token (the gateway's add, the tokenizer's). Nothing to cancel:
        it is in the socket's buffer when this returns True."""
        call = self._call
        if self._writes_waiting or not isinstance(call, LinkCall):
            return False
        return call.send_now(msg)

    async def _write(self, msg: Any) -> None:
        try:
            async with self._write_lock:
                call = await self._session()
                await call.write(msg)
        finally:
            self._writes_waiting -= 1

    async def _session(self) -> Any:
        if self._call is None:
            self._call = await self.open_stream(*stream_method(self.stage, "Session"))
            asyncio.get_running_loop().create_task(self._read(self._call))
        return self._call

    async def open_stream(self, method: str, response_type: Any, request: Any | None = None,
                          connect_timeout: float | None = None) -> Any:
        """Start the stage's streaming `method` (its full path) with `request` (None: a
        bidirectional stream) and return the call; StageUnavailable when the stage cannot be
        reached within the connect timeout."""
        timeout = self.connect_timeout if connect_timeout is None else connect_timeout
        linked = await self._open_link(method, response_type, request, timeout)
        if linked is not None:
            return linked
        # A channel that saw the stage die fails calls at once until it reconnects: wait
        # (briefly) for it, so a stage that is back is used at once.
        try:
            await asyncio.wait_for(self.channel.channel_ready(), timeout)
        except TimeoutError as exc:
            raise StageUnavailable(self.stage, f"cannot connect to {self.target}") from exc
        # The stage may have come up while we waited (its link listens before its gRPC port).
        linked = await self._open_link(method, response_type, request, timeout)
        if linked is not None:
            return linked
        if request is None:
            return self.channel.stream_stream(
                method, request_serializer=_serialize,
                response_deserializer=response_type.FromString)(metadata=stage_metadata())
        return self.channel.unary_stream(
            method, request_serializer=_serialize,
            response_deserializer=response_type.FromString)(request, metadata=stage_metadata())

    async def _read(self, call: Any) -> None:
        error: StageUnavailable
        try:
            while True:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    error = StageUnavailable(self.stage, "stream closed by the stage")
                    break
                future = self._pending.pop(resp.seq, None)
                if future is not None and not future.done():
                    future.set_result(resp)
        except (grpc.aio.AioRpcError, asyncio.CancelledError) as exc:
            error = StageUnavailable(self.stage, _detail(exc))
        if self._call is call:
            self._call = None
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        if self.on_lost is not None and not self._closing:
            logger.warning("%s", error.message)
            await self.on_lost(error)

    async def close(self) -> None:
        self._closing = True
        if self._call is not None:
            self._call.cancel()
        await self.channel.close()


    async def _open_link(self, method: str, response_type: Any, request: Any | None,
                         timeout: float) -> LinkCall | None:
        """The stream over the local link, or None where there is none (the stage is not on
        this host, is down, or serves gRPC only)."""
        if self._link_port is None:
            return None
        try:
            return await LinkCall.open(self._link_port, method,
                                       dict(stage_metadata()).get("authorization"),
                                       response_type, request, self.max_message_bytes, timeout)
        except (OSError, TimeoutError):
            return None


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()  # type: ignore[no-any-return]


def _detail(exc: BaseException) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return type(exc).__name__


__all__ = ["StageClient", "StageError", "StageUnavailable"]
