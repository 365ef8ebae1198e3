"""The detokenizer's subscription to one engine replica's step outputs, kept open (reconnecting)
for as long as the stage runs (one per replica, sharing the OutputProcessor and the routes).

Each step: OutputProcessor.process_outputs, stop-string aborts to the engine, RequestOutputs to
their gateways. When the subscription breaks (the engine died), every request here ends with
finish_reason "error" naming the engine, at once (with replicas: every request of that replica;
the others' go on); the engine aborts what it had when it loses
its subscriber, so a restarted engine and this stage start clean together.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from engine_core.processing.output_processor import OutputProcessor
from services._proto.strand.v1 import engine_pb2 as epb
from services._proto.strand.v1 import engine_pb2_grpc
from services.common.convert import core_outputs_from_pb, request_output_to_pb
from services.common.stage_auth import stage_metadata
from services.common.stage_client import StageClient
from services.common.status import StageError
from services.common.subscriber import Subscriber
from services.common.tracing import context_from_carrier, server_span
from services.detokenizer.routes import Routes

logger = logging.getLogger(__name__)

class EngineFeed(Subscriber):
    not_subscribed = "the detokenizer is not subscribed to its outputs"

    def __init__(self, processor: OutputProcessor, routes: Routes, engine_addr: str) -> None:
        super().__init__(StageClient("engine", engine_addr, engine_pb2_grpc.EngineStub))
        self.processor = processor
        self.routes = routes
        self.engine = self.client
        self.name = engine_addr  # the replica, as the tokenizer's router names it
        self._background: set[asyncio.Task[None]] = set()

    async def close(self) -> None:
        await super().close()
        await self.engine.close()

    def open(self) -> Any:
        return engine_pb2_grpc.EngineStub(self.engine.channel).Outputs(
            epb.EngineOutputsRequest(), metadata=stage_metadata())

    async def on_message(self, msg: epb.EngineStepOutputs) -> None:
        await self._on_step(msg)

    def on_lost(self, detail: str, was_subscribed: bool) -> None:
        if was_subscribed:
            logger.warning("engine stage is unavailable: %s", detail)
        self._end_all_with_error(f"engine stage is unavailable: {detail}")

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
        ids = self.routes.owned(engine=self.name)
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
