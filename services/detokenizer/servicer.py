"""Detokenizer servicer: the ring's last stage. The engine's step outputs come in on a
subscription (EngineFeed), become RequestOutputs here and go to the gateway that owns each
request on its Outputs subscription. The tokenizer adds request state on a Session (always before
the engine has the request, so before its first output); gateways abort on theirs."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from engine_core.processing.output_processor import OutputProcessor
from services._proto.strand.v1 import detokenizer_pb2 as dpb
from services._proto.strand.v1 import detokenizer_pb2_grpc
from services._proto.strand.v1 import engine_pb2 as epb
from services.common.convert import core_request_to_pb
from services.common.convert_core import processed_from_pb
from services.common.status import StageError, error_to_pb, status_of
from services.common.tracing import context_from_carrier, server_span
from services.detokenizer.engine_feed import EngineFeed
from services.detokenizer.routes import Routes

logger = logging.getLogger(__name__)

# An add waits this long for the engine subscription (a restarted engine or detokenizer is
# subscribed again within a fraction of it) before it is refused as UNAVAILABLE.
SUBSCRIBE_WAIT_S = 1.0


class DetokenizerServicer(detokenizer_pb2_grpc.DetokenizerServicer):
    def __init__(self, processor: OutputProcessor, feed: EngineFeed) -> None:
        self.processor = processor
        self.routes = feed.routes
        self.feed = feed

    @classmethod
    def create(cls, processor: OutputProcessor, engine_addr: str) -> DetokenizerServicer:
        return cls(processor, EngineFeed(processor, Routes(), engine_addr))

    def ready(self) -> bool:
        return self.feed.subscribed

    async def Outputs(self, request: dpb.DetokOutputsRequest,
                      context: grpc.aio.ServicerContext) -> AsyncIterator[dpb.OutputBatch]:
        if not request.origin:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "origin must not be empty")
        queue = self.routes.subscribe(request.origin)
        try:
            yield dpb.OutputBatch(subscribed=True)
            while True:
                batch = await queue.get()
                if batch is None:
                    return
                yield batch
        finally:
            orphans = self.routes.unsubscribe(request.origin, queue)
            if orphans:
                # Its gateway is gone: nobody would ever collect or abort these.
                logger.info("gateway %s left; aborting its %d requests", request.origin,
                            len(orphans))
                self.feed.abort_in_engine_later(self.processor.abort_requests(orphans))

    async def Session(self, request_iterator: AsyncIterator[dpb.DetokenizerRequest],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[dpb.DetokenizerResponse]:
        async for msg in request_iterator:
            yield await self.answer(msg)

    async def answer(self, msg: dpb.DetokenizerRequest) -> dpb.DetokenizerResponse:
        kind = msg.WhichOneof("kind")
        parent = context_from_carrier(msg.trace_context)
        with server_span(f"strand.v1.Detokenizer/{kind}", parent) as span:
            try:
                return await self._dispatch(msg, kind)
            except Exception as exc:  # answered in-stream: the session stays open
                span.set_attribute("error.message", str(exc))
                span.set_attribute("error.type", status_of(exc)[0].name)
                return dpb.DetokenizerResponse(seq=msg.seq, error=error_to_pb(exc))

    async def _dispatch(self, msg: dpb.DetokenizerRequest, kind: str | None
                        ) -> dpb.DetokenizerResponse:
        handler = _HANDLERS.get(kind or "")
        if handler is None:
            raise ValueError(f"kind must be one of {', '.join(sorted(_HANDLERS))}, got {kind!r}")
        return await handler(self, msg)

    async def _on_add(self, msg: dpb.DetokenizerRequest) -> dpb.DetokenizerResponse:
        return dpb.DetokenizerResponse(seq=msg.seq, children=await self._add(msg.add))

    async def _on_abort(self, msg: dpb.DetokenizerRequest) -> dpb.DetokenizerResponse:
        child_ids = self.processor.abort_requests(list(msg.abort.request_ids),
                                                  not msg.abort.never_admitted)
        self.routes.forget(msg.abort.request_ids)
        if child_ids:
            # Answered once the engine has dropped them too: no step after the Abort call
            # computes them (LLMEngine.abort_request's promise).
            await self.feed.engine.call(epb.EngineRequest(
                abort=epb.EngineAbort(request_ids=child_ids)))
        return dpb.DetokenizerResponse(seq=msg.seq,
                                       child_ids=dpb.RequestIds(request_ids=child_ids))

    async def _on_query(self, msg: dpb.DetokenizerRequest) -> dpb.DetokenizerResponse:
        return dpb.DetokenizerResponse(seq=msg.seq, state=dpb.DetokState(
            num_unfinished_requests=self.processor.get_num_unfinished_requests(),
            engine_subscribed=self.feed.subscribed))

    async def _add(self, add: dpb.DetokAddRequest) -> dpb.ChildRequests:
        if not add.origin:
            raise ValueError("origin must not be empty")
        await self.feed.wait_subscribed(SUBSCRIBE_WAIT_S)
        if not self.routes.is_subscribed(add.origin):
            raise StageError(grpc.StatusCode.UNAVAILABLE,
                             f"detokenizer stage is unavailable: gateway {add.origin!r} has no "
                             f"output subscription here")
        processed = processed_from_pb(add.processed)
        children = self.processor.add_request(processed)
        self.routes.own(processed.request.request_id, add.origin)
        return dpb.ChildRequests(requests=[core_request_to_pb(c) for c in children])


# Session message kinds and their handlers: a new kind is one method and one entry.
_HANDLERS: dict[str, Callable[[DetokenizerServicer, dpb.DetokenizerRequest],
                              Awaitable[dpb.DetokenizerResponse]]] = {
    "add": DetokenizerServicer._on_add,
    "abort": DetokenizerServicer._on_abort,
    "query": DetokenizerServicer._on_query,
}
