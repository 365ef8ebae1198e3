"""Detokenizer servicer: each message is one call on the OutputProcessor."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from engine_core.processing.output_processor import OutputProcessor
from services._proto.strand.v1 import detokenizer_pb2 as dpb
from services._proto.strand.v1 import detokenizer_pb2_grpc
from services.common.convert import (
    core_outputs_from_pb,
    core_request_to_pb,
    request_output_to_pb,
)
from services.common.convert_core import processed_from_pb
from services.common.ownership import SessionOwnership
from services.common.status import error_to_pb
from services.common.tracing import context_from_carrier, server_span


class DetokenizerServicer(detokenizer_pb2_grpc.DetokenizerServicer):
    def __init__(self, processor: OutputProcessor) -> None:
        self.processor = processor
        self._owners = SessionOwnership()

    async def Session(self, request_iterator: AsyncIterator[dpb.DetokenizerRequest],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[dpb.DetokenizerResponse]:
        session = self._owners.new_session()
        try:
            async for msg in request_iterator:
                yield self.handle(msg, session)
        finally:
            # The gateway is gone: nobody would ever collect or abort what it added.
            orphans = self._owners.release(session)
            if orphans:
                self.processor.abort_requests(orphans)

    def handle(self, msg: dpb.DetokenizerRequest, session: int = 0) -> dpb.DetokenizerResponse:
        kind = msg.WhichOneof("kind")
        parent = context_from_carrier(msg.trace_context)
        with server_span(f"strand.v1.Detokenizer/{kind}", parent) as span:
            try:
                return self._dispatch(msg, kind, session)
            except Exception as exc:  # answered in-stream: the session stays open
                span.set_attribute("error.message", str(exc))
                return dpb.DetokenizerResponse(seq=msg.seq, error=error_to_pb(exc))

    def _dispatch(self, msg: dpb.DetokenizerRequest, kind: str | None, session: int
                  ) -> dpb.DetokenizerResponse:
        seq = msg.seq
        if kind == "add":
            processed = processed_from_pb(msg.add.processed)
            request_id = processed.request.request_id
            if self.processor.has_request(request_id):
                raise ValueError(f"request_id {request_id!r} is already in use")
            children = self.processor.add_request(processed)
            self._owners.add(session, [request_id])
            return dpb.DetokenizerResponse(seq=seq, children=dpb.ChildRequests(
                requests=[core_request_to_pb(c) for c in children]))
        if kind == "process_outputs":
            outputs = core_outputs_from_pb(msg.process_outputs.outputs)
            result = self.processor.process_outputs(outputs.outputs, outputs.timestamp)
            self._owners.discard(o.request_id for o in result.request_outputs if o.finished)
            return dpb.DetokenizerResponse(seq=seq, result=dpb.ProcessOutputsResult(
                request_outputs=[request_output_to_pb(o) for o in result.request_outputs],
                reqs_to_abort=list(result.reqs_to_abort)))
        if kind == "abort":
            child_ids = self.processor.abort_requests(list(msg.abort.request_ids))
            self._owners.discard(msg.abort.request_ids)
            return dpb.DetokenizerResponse(seq=seq,
                                           child_ids=dpb.RequestIds(request_ids=child_ids))
        if kind == "finish_with_error":
            req = msg.finish_with_error
            ended = self.processor.finish_with_error(list(req.request_ids), req.reason)
            self._owners.discard(req.request_ids)
            return dpb.DetokenizerResponse(seq=seq, result=dpb.ProcessOutputsResult(
                request_outputs=[request_output_to_pb(o) for o in ended]))
        if kind == "query":
            num = self.processor.get_num_unfinished_requests()
            return dpb.DetokenizerResponse(seq=seq, state=dpb.DetokState(
                num_unfinished_requests=num))
        raise ValueError(f"kind must be one of add, process_outputs, abort, finish_with_error, "
                         f"query, got {kind!r}")
