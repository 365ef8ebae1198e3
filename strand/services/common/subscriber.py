"""A server-streaming subscription to another stage, kept open (re-opened every RESUBSCRIBE_S
after it breaks) for as long as this stage runs. The stage's first message says the
subscription is in place (`subscribed`); subclasses open the call, take each message, and decide
what a lost subscription means."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc

from strand.services.common.stage_client import StageClient
from strand.services.common.stage_link import stream_method
from strand.services.common.status import StageUnavailable

logger = logging.getLogger(__name__)

RESUBSCRIBE_S = 0.1


class Resubscribe(Exception):  # noqa: N818 - a request, not an error
    """Raised by on_message: end this subscription and open a fresh one (e.g. to get a new
    snapshot after a sequence gap)."""


class Subscriber:
    # What wait_subscribed's UNAVAILABLE says (after "<stage> stage is unavailable: ").
    not_subscribed = "no output subscription"

    def __init__(self, client: StageClient) -> None:
        self.client = client
        self._subscribed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def subscribed(self) -> bool:
        return self._subscribed is not None and self._subscribed.is_set()

    def start(self) -> None:
        self._subscribed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def wait_subscribed(self, timeout: float) -> None:
        if self._subscribed is None:
            raise StageUnavailable(self.client.stage, "the subscription has not started")
        try:
            await asyncio.wait_for(self._subscribed.wait(), timeout)
        except TimeoutError as exc:
            raise StageUnavailable(self.client.stage, self.not_subscribed) from exc

    # The stage's server-streaming method this follows ("Outputs", "KvEvents").
    method = ""

    def request(self) -> Any:
        """The subscription's one request message."""
        raise NotImplementedError

    async def on_message(self, msg: Any) -> None:
        raise NotImplementedError

    def on_subscribed(self, msg: Any) -> None:
        """The stage's first message (`subscribed`): what it says besides (a snapshot)."""

    def on_lost(self, detail: str, was_subscribed: bool) -> None:
        """The subscription ended (or could not be opened), for `detail`."""

    async def _run(self) -> None:
        assert self._subscribed is not None
        while True:
            try:
                detail = await self._follow()
            except Exception as exc:  # a fault in on_message must not end the subscription
                logger.exception("%s subscription failed", self.client.stage)
                detail = f"{type(exc).__name__}: {exc}"
            was_subscribed = self._subscribed.is_set()
            self._subscribed.clear()
            self.on_lost(detail, was_subscribed)
            await asyncio.sleep(RESUBSCRIBE_S)

    async def _follow(self) -> str:
        """Read the subscription until it ends; why it ended."""
        assert self._subscribed is not None
        try:
            call = await self.client.open_stream(*stream_method(self.client.stage, self.method),
                                                 self.request(), connect_timeout=2.0)
            async for msg in call:
                if msg.subscribed:
                    self.on_subscribed(msg)
                    self._subscribed.set()
                    continue
                await self.on_message(msg)
            return "its output stream ended"
        except Resubscribe as exc:
            return f"resubscribing: {exc}"
        except StageUnavailable:
            return f"cannot connect to {self.client.target}"
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
