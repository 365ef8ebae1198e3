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
import time
from collections.abc import Coroutine, Iterable
from typing import Any

from strand.engine_core.core.engine_io import EngineCoreOutput
from strand.engine_core.processing.output_processor import OutputProcessor
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import engine_pb2_grpc
from strand.services.common.convert import (
    core_outputs_from_pb,
    pooling_output_to_pb,
    request_output_to_pb,
)
from strand.services.common.stage_client import StageClient
from strand.services.common.status import StageError
from strand.services.common.subscriber import Subscriber
from strand.services.common.tracing import context_from_carrier, server_span
from strand.services.detokenizer.early_outputs import EarlyOutputs
from strand.services.detokenizer.routes import Routes

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
        self.early = EarlyOutputs()

    async def close(self) -> None:
        await super().close()
        await self.engine.close()

    method = "Outputs"

    def request(self) -> epb.EngineOutputsRequest:
        return epb.EngineOutputsRequest()

    async def on_message(self, msg: epb.EngineStepOutputs) -> None:
        await self._on_step(msg)

    def on_lost(self, detail: str, was_subscribed: bool) -> None:
        if was_subscribed:
            logger.warning("engine stage is unavailable: %s", detail)
        self.early.clear()
        self._end_all_with_error(f"engine stage is unavailable: {detail}")

    async def _on_step(self, msg: epb.EngineStepOutputs) -> None:
        with server_span("strand.v1.Detokenizer/process_outputs",
                         context_from_carrier(msg.trace_context)):
            outputs = core_outputs_from_pb(msg.outputs)
            known = self._keep_early(outputs.outputs, outputs.timestamp)
            abort = self._process(known, outputs.timestamp, msg.step_id, msg.origin)
        if abort is not None:
            await abort

    def _keep_early(self, outputs: list[EngineCoreOutput], timestamp: float
                    ) -> list[EngineCoreOutput]:
        """Outputs of requests not here yet are kept for them (early_outputs.py); those of
        requests that ended here are late and go on to be dropped; the rest are returned."""
        processor = self.processor
        unknown = [o for o in outputs if not processor.has_request(o.request_id)
                   and not processor.recently_ended(o.request_id)]
        if not unknown:
            return outputs
        self.early.keep(unknown, timestamp, time.monotonic())
        early_ids = {o.request_id for o in unknown}
        return [o for o in outputs if o.request_id not in early_ids]

    def arrived(self, child_ids: Iterable[str]) -> None:
        """A request was added here: its outputs that came first are processed now, before any
        later step's."""
        for timestamp, outputs in self.early.take(child_ids, time.monotonic()):
            self._process(outputs, timestamp)

    def _process(self, outputs: list[EngineCoreOutput], timestamp: float, step_id: int = 0,
                 step_origin: str = "") -> Coroutine[Any, Any, None] | None:
        """RequestOutputs to their gateways; the engine abort of what stop strings ended, which a
        Step's caller awaits (a Step returns only once they are gone, as LLMEngine.step does)
        and auto mode sends in the background (the engine may run a step or two on;
        process_outputs drops those tokens)."""
        result = self.processor.process_outputs(outputs, timestamp)
        abort = None
        if result.reqs_to_abort:
            abort = self._abort_in_engine(list(result.reqs_to_abort))
            if not step_id:
                self._spawn(abort)
                abort = None
        self.routes.send([*(request_output_to_pb(o) for o in result.request_outputs),
                          *(pooling_output_to_pb(o) for o in result.pooling_outputs)],
                         step_id, step_origin)
        return abort

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
