"""The gateway's subscription to the detokenizer's outputs for its own requests (its origin),
kept open (reconnecting) for as long as the gateway runs. Each batch goes to `on_batch`; when the
subscription breaks, `on_lost` is told why, once, and a new one is opened."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from services._proto.strand.v1 import detokenizer_pb2 as dpb
from services._proto.strand.v1 import detokenizer_pb2_grpc
from services.common.stage_auth import stage_metadata
from services.common.stage_client import StageClient
from services.common.status import StageUnavailable

logger = logging.getLogger(__name__)

RESUBSCRIBE_S = 0.1


class OutputFeed:
    def __init__(self, detokenizer: StageClient, origin: str,
                 on_batch: Callable[[dpb.OutputBatch], None],
                 on_lost: Callable[[str], None]) -> None:
        self.detokenizer = detokenizer
        self.origin = origin
        self._on_batch = on_batch
        self._on_lost = on_lost
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
            raise StageUnavailable("detokenizer", "the gateway has not subscribed yet")
        try:
            await asyncio.wait_for(self._subscribed.wait(), timeout)
        except TimeoutError as exc:
            raise StageUnavailable("detokenizer", "no output subscription") from exc

    async def _run(self) -> None:
        assert self._subscribed is not None
        while True:
            detail = await self._follow()
            was_subscribed = self._subscribed.is_set()
            self._subscribed.clear()
            if was_subscribed:
                reason = f"detokenizer stage is unavailable: {detail}"
                logger.warning("%s", reason)
                self._on_lost(reason)
            await asyncio.sleep(RESUBSCRIBE_S)

    async def _follow(self) -> str:
        assert self._subscribed is not None
        try:
            await asyncio.wait_for(self.detokenizer.channel.channel_ready(), 2.0)
            call = detokenizer_pb2_grpc.DetokenizerStub(self.detokenizer.channel).Outputs(
                dpb.DetokOutputsRequest(origin=self.origin), metadata=stage_metadata())
            async for batch in call:
                if batch.subscribed:
                    self._subscribed.set()
                    continue
                self._on_batch(batch)
            return "its output stream ended"
        except TimeoutError:
            return f"cannot connect to {self.detokenizer.target}"
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
