"""Tokenizer servicer: ProcessRequest -> InputProcessor.process -> ProcessedPrompt."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from engine_core.processing.input_processor import InputProcessor
from services._proto.strand.v1 import tokenizer_pb2 as tpb
from services._proto.strand.v1 import tokenizer_pb2_grpc
from services.common.convert import params_from_pb, prompt_from_pb
from services.common.convert_core import processed_to_pb
from services.common.status import error_to_pb
from services.common.tracing import context_from_carrier, server_span


class TokenizerServicer(tokenizer_pb2_grpc.TokenizerServicer):
    def __init__(self, processor: InputProcessor) -> None:
        self.processor = processor

    async def Session(self, request_iterator: AsyncIterator[tpb.TokenizerRequest],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[tpb.TokenizerResponse]:
        async for msg in request_iterator:
            yield self.handle(msg)

    def handle(self, msg: tpb.TokenizerRequest) -> tpb.TokenizerResponse:
        req = msg.process
        parent = context_from_carrier(msg.trace_context)
        with server_span("strand.v1.Tokenizer/Process", parent,
                         {"gen_ai.request.id": req.request_id}) as span:
            try:
                params = params_from_pb(req.params) if req.HasField("params") else None
                processed = self.processor.process(
                    req.request_id, prompt_from_pb(req.prompt), params,
                    req.arrival_time if req.HasField("arrival_time") else None, req.priority)
            except Exception as exc:  # answered in-stream: the session stays open
                span.set_attribute("error.message", str(exc))
                return tpb.TokenizerResponse(seq=msg.seq, error=error_to_pb(exc))
            span.set_attribute("gen_ai.usage.prompt_tokens",
                               len(processed.request.prompt_token_ids))
            return tpb.TokenizerResponse(seq=msg.seq, processed=processed_to_pb(processed))
