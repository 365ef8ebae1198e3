"""The detokenizer's subscription to the engine's step outputs, kept open (reconnecting) for as
long as the stage runs.

Each step: OutputProcessor.process_outputs, stop-string aborts to the engine, RequestOutputs to
their gateways. When the subscription breaks (the engine died), every request here ends with
finish_reason "error" naming the engine, at once; the engine aborts what it had when it loses
its subscriber, so a restarted engine and this stage start clean together.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

import grpc

from engine_core.processing.output_processor import OutputProcessor
from services._proto.strand.v1 import engine_pb2 as epb
from services._proto.strand.v1 import engine_pb2_grpc
from services.common.convert import core_outputs_from_pb, request_output_to_pb
from services.common.stage_auth import stage_metadata
from services.common.stage_client import StageClient
from services.common.status import StageError, StageUnavailable
from services.common.tracing import context_from_carrier, server_span
from services.detokenizer.routes import Routes

logger = logging.getLogger(__name__)

RESUBSCRIBE_S = 0.1


class EngineFeed:
    def __init__(self, processor: OutputProcessor, routes: Routes, engine_addr: str) -> None:
        self.processor = processor
        self.routes = routes
        self.engine = StageClient("engine", engine_addr, engine_pb2_grpc.EngineStub)
        self._subscribed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    @property
    def subscribed(self) -> bool:
        return self._subscribed is not None and self._subscribed.is_set()

    def start(self) -> None:
        self._subscribed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        await self.engine.close()

    async def wait_subscribed(self, timeout: float) -> None:
        if self._subscribed is None:
            raise StageUnavailable("engine", "the detokenizer has not started its subscription")
        try:
            await asyncio.wait_for(self._subscribed.wait(), timeout)
        except TimeoutError as exc:
            raise StageUnavailable("engine", "the detokenizer is not subscribed to its "
                                             "outputs") from exc

    async def _run(self) -> None:
        assert self._subscribed is not None
        while True:
            detail = await self._follow()
            was_subscribed = self._subscribed.is_set()
            self._subscribed.clear()
            if was_subscribed:
                logger.warning("engine stage is unavailable: %s", detail)
            self._end_all_with_error(f"engine stage is unavailable: {detail}")
            await asyncio.sleep(RESUBSCRIBE_S)

    async def _follow(self) -> str:
        """Read the engine's outputs until the subscription ends; why it ended."""
        assert self._subscribed is not None
        try:
            await asyncio.wait_for(self.engine.channel.channel_ready(), 2.0)
            call = engine_pb2_grpc.EngineStub(self.engine.channel).Outputs(
                epb.EngineOutputsRequest(), metadata=stage_metadata())
            async for msg in call:
                if msg.subscribed:
                    self._subscribed.set()
                    continue
                await self._on_step(msg)
            return "its output stream ended"
        except TimeoutError:
            return f"cannot connect to {self.engine.target}"
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"

    async def _on_step(self, msg: epb.EngineStepOutputs) -> None:
        with server_span("strand.v1.Detokenizer/process_outputs",
                         context_from_carrier(msg.trace_context)):
            outputs = core_outputs_from_pb(msg.outputs)
            result = self.processor.process_outputs(outputs.outputs, outputs.timestamp)
        if result.reqs_to_abort:
            # Stop strings end requests here; the engine must stop computing them. A Step call
            # returns only once they are gone (as LLMEngine.step does); in auto mode the engine
            # may run a step or two on, and process_outputs drops those tokens.
            abort = self._abort_in_engine(list(result.reqs_to_abort))
            if msg.step_id:
                await abort
            else:
                self._spawn(abort)
        self.routes.send([request_output_to_pb(o) for o in result.request_outputs],
                         msg.step_id, msg.origin)

    def _end_all_with_error(self, reason: str) -> None:
        ids = self.routes.owned()
        if ids:
            ended = self.processor.finish_with_error(ids, reason)
            self.routes.send([request_output_to_pb(o) for o in ended])
            self.routes.forget(ids)

    def abort_in_engine_later(self, child_ids: list[str]) -> None:
        if child_ids:
            self._spawn(self._abort_in_engine(child_ids))

    async def _abort_in_engine(self, child_ids: list[str]) -> None:
        try:
            await self.engine.call(epb.EngineRequest(
                abort=epb.EngineAbort(request_ids=child_ids)))
        except StageError as exc:
            # An engine that is gone has dropped them anyway (it aborts all on losing us).
            logger.info("abort of %d requests in the engine failed: %s", len(child_ids),
                        exc.message)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._background.discard)


__all__ = ["EngineFeed"]
