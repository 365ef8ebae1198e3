"""Detokenizer servicer: the ring's last stage. The engine's step outputs come in on a
subscription (EngineFeed), become RequestOutputs here and go to the gateway that owns each
request on its Outputs subscription. The tokenizer adds request state on a Session (before the
engine has the request, or, with an auto-stepping engine, at the same time: outputs that beat
their request here wait for it, see early_outputs.py); gateways abort on theirs.

With engine replicas there is one subscription per replica; each request remembers the replica
the tokenizer's router chose, so its aborts go there and only that replica's loss ends it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from strand.engine_core.processing.output_processor import OutputProcessor
from strand.services._proto.strand.v1 import detokenizer_pb2 as dpb
from strand.services._proto.strand.v1 import detokenizer_pb2_grpc
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services.common.convert_core import processed_from_pb
from strand.services.common.status import StageError, error_to_pb, status_of
from strand.services.common.tracing import context_from_carrier, server_span
from strand.services.detokenizer.engine_feed import EngineFeed
from strand.services.detokenizer.routes import Routes

logger = logging.getLogger(__name__)

# An add waits this long for the engine subscription (a restarted engine or detokenizer is
# subscribed again within a fraction of it) before it is refused as UNAVAILABLE.
SUBSCRIBE_WAIT_S = 1.0


class DetokenizerServicer(detokenizer_pb2_grpc.DetokenizerServicer):
    def __init__(self, processor: OutputProcessor, feeds: list[EngineFeed]) -> None:
        if not feeds:
            raise ValueError("feeds must not be empty: the detokenizer needs an engine")
        self.processor = processor
        self.routes = feeds[0].routes
        self.feeds = {f.name: f for f in feeds}

    @classmethod
    def create(cls, processor: OutputProcessor, engine_addrs: list[str]) -> DetokenizerServicer:
        routes = Routes()
        return cls(processor, [EngineFeed(processor, routes, a) for a in engine_addrs])

    def start(self) -> None:
        for feed in self.feeds.values():
            feed.start()

    async def close(self) -> None:
        for feed in self.feeds.values():
            await feed.close()

    def ready(self) -> bool:
        # Serving as long as one replica is: the router sends nothing to the others.
        return any(f.subscribed for f in self.feeds.values())

    def _feed_for(self, engine: str) -> EngineFeed:
        if not engine and len(self.feeds) == 1:
            return next(iter(self.feeds.values()))
        feed = self.feeds.get(engine)
        if feed is None:
            raise ValueError(f"engine must be one of {sorted(self.feeds)}, got {engine!r}")
        return feed

    def abort_everywhere(self, request_ids: list[str], count_as_aborted: bool = True
                         ) -> dict[EngineFeed, list[str]]:
        """Drop requests here; per replica, the engine requests (children) to abort there.
        count_as_aborted=False: taking back requests an engine refused (not aborts in the
        metrics: they never ran)."""
        by_feed: dict[EngineFeed, list[str]] = {}
        for request_id in request_ids:
            engine = self.routes.engine_of(request_id)
            child_ids = self.processor.abort_requests([request_id], count_as_aborted)
            if child_ids and engine is not None and engine in self.feeds:
                by_feed.setdefault(self.feeds[engine], []).extend(child_ids)
        self.routes.forget(request_ids)
        return by_feed

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
                for feed, child_ids in self.abort_everywhere(orphans).items():
                    feed.abort_in_engine_later(child_ids)

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
        return dpb.DetokenizerResponse(seq=msg.seq, child_ids=await self._add(msg.add))

    async def _on_abort(self, msg: dpb.DetokenizerRequest) -> dpb.DetokenizerResponse:
        by_feed = self.abort_everywhere(list(msg.abort.request_ids),
                                        not msg.abort.never_admitted)
        # Answered once each engine has dropped them too: no step after the Abort call
        # computes them (LLMEngine.abort_request's promise).
        await asyncio.gather(*(feed.engine.call(epb.EngineRequest(
            abort=epb.EngineAbort(request_ids=ids))) for feed, ids in by_feed.items()))
        child_ids = [c for ids in by_feed.values() for c in ids]
        return dpb.DetokenizerResponse(seq=msg.seq,
                                       child_ids=dpb.RequestIds(request_ids=child_ids))

    async def _on_query(self, msg: dpb.DetokenizerRequest) -> dpb.DetokenizerResponse:
        return dpb.DetokenizerResponse(seq=msg.seq, state=dpb.DetokState(
            num_unfinished_requests=self.processor.get_num_unfinished_requests(),
            engine_subscribed=self.ready()))

    async def _add(self, add: dpb.DetokAddRequest) -> dpb.RequestIds:
        if not add.origin:
            raise ValueError("origin must not be empty")
        feed = self._feed_for(add.engine)
        await feed.wait_subscribed(SUBSCRIBE_WAIT_S)
        if not self.routes.is_subscribed(add.origin):
            raise StageError(grpc.StatusCode.UNAVAILABLE,
                             f"detokenizer stage is unavailable: gateway {add.origin!r} has no "
                             f"output subscription here")
        processed = processed_from_pb(add.processed)
        children = self.processor.add_request(processed)
        self.routes.own(processed.request.request_id, add.origin, feed.name)
        child_ids = [c.request_id for c in children]
        feed.arrived(child_ids)
        return dpb.RequestIds(request_ids=child_ids)


# Session message kinds and their handlers: a new kind is one method and one entry.
_HANDLERS: dict[str, Callable[[DetokenizerServicer, dpb.DetokenizerRequest],
                              Awaitable[dpb.DetokenizerResponse]]] = {
    "add": DetokenizerServicer._on_add,
    "abort": DetokenizerServicer._on_abort,
    "query": DetokenizerServicer._on_query,
}
