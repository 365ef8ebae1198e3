"""vllm.grpc.engine.VllmEngine over a Strand stack: each RPC is a call on the gateway (the
request RPCs here; the engine-wide ones in admin.py, the descriptions in info.py).

A request's call ends its Strand request: leaving AsyncEngineClient.generate (the caller
cancelled, smg aborted, the stream broke) cancels the gateway call, which aborts it in the
engine. Generate and Embed run in a SERVER span under the caller's trace context (smg's, or
none), current while the gateway is called, so the gateway's spans are its children."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager
from typing import Any, TypeAlias

import grpc
from smg_grpc_proto.generated import common_pb2 as cmn
from smg_grpc_proto.generated import vllm_engine_pb2 as vpb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as vgrpc

from strand.engine_core.outputs import PoolingRequestOutput, RequestOutput
from strand.services.client import RequestError, ServerUnavailable
from strand.services.common.tracing import context_from_metadata, server_span
from strand.services.vllm_grpc import admin, info
from strand.services.vllm_grpc.convert import (
    FieldError,
    chunk_response,
    complete_response,
    prompt_from_request,
    refuse_unsupported,
    sampling_params_from_proto,
)
from strand.services.vllm_grpc.kv_events import KvEventRelay
from strand.services.vllm_grpc.link import GatewayLink

logger = logging.getLogger(__name__)
Context: TypeAlias = grpc.aio.ServicerContext


class VllmEngineServicer(vgrpc.VllmEngineServicer):
    def __init__(self, link: GatewayLink) -> None:
        self.link = link
        self.kv_relay = KvEventRelay(link)

    async def Generate(self, request: vpb.GenerateRequest, context: Context
                       ) -> AsyncIterator[vpb.GenerateResponse]:
        logger.debug("Generate %s", request)
        try:
            refuse_unsupported(request)
            prompt = prompt_from_request(request)
            params = sampling_params_from_proto(request.sampling_params, request.stream)
        except FieldError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        num_logprobs = params.logprobs
        seen: set[int] = set()
        # The handler runs in one task: the span's context stays current across the yields.
        with _request_span("Generate", request.request_id, context):
            try:
                async for output in self.link.client.generate(prompt, params,
                                                               request.request_id or None):
                    for response in _responses(output, request.stream, num_logprobs, seen):
                        yield response
            except (RequestError, ServerUnavailable, grpc.RpcError) as exc:
                await _abort_with(context, exc)

    async def Embed(self, request: vpb.EmbedRequest, context: Context) -> vpb.EmbedResponse:
        ids = list(request.tokenized.input_ids)
        if not ids:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "tokenized.input_ids: must not be empty")
        try:
            with _request_span("Embed", request.request_id, context):
                output: PoolingRequestOutput = await self.link.client.embed(
                    {"prompt_token_ids": ids}, request_id=request.request_id or None)
        except (RequestError, ServerUnavailable, grpc.RpcError, RuntimeError) as exc:
            await _abort_with(context, exc)
        values = output.outputs.values
        return vpb.EmbedResponse(embedding=values, prompt_tokens=len(output.prompt_token_ids),
                                 embedding_dim=len(values))

    async def Abort(self, request: vpb.AbortRequest, context: Context) -> vpb.AbortResponse:
        """Ids not running (finished, never seen) are ignored, as vLLM's engine ignores them."""
        try:
            await self.link.client.abort_request(list(request.request_ids))
        except (RequestError, ServerUnavailable, grpc.RpcError) as exc:
            await _abort_with(context, exc)
        return vpb.AbortResponse()

    async def HealthCheck(self, request: vpb.HealthCheckRequest, context: Context
                          ) -> vpb.HealthCheckResponse:
        return await info.health_check(self.link)

    async def GetModelInfo(self, request: vpb.GetModelInfoRequest, context: Context
                           ) -> vpb.GetModelInfoResponse:
        return await _guarded(context, info.model_info(self.link))

    async def GetServerInfo(self, request: vpb.GetServerInfoRequest, context: Context
                            ) -> vpb.GetServerInfoResponse:
        return await _guarded(context, info.server_info(self.link))

    async def GetLoads(self, request: vpb.GetLoadsRequest, context: Context
                       ) -> vpb.GetLoadsResponse:
        if request.HasField("dp_rank") and request.dp_rank != 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"dp_rank: this worker serves rank 0 only, got {request.dp_rank}")
        return await _guarded(context, admin.get_loads(self.link))

    async def FlushCache(self, request: cmn.FlushCacheRequest, context: Context
                         ) -> cmn.FlushCacheResponse:
        return await admin.flush_cache(self.link, request, context)

    async def StartProfile(self, request: cmn.StartProfileRequest, context: Context
                           ) -> cmn.ProfileResponse:
        return await admin.start_profile(self.link, request, context)

    async def StopProfile(self, request: cmn.StopProfileRequest, context: Context
                          ) -> cmn.ProfileResponse:
        return await admin.stop_profile(self.link, context)

    async def GetTokenizer(self, request: cmn.GetTokenizerRequest, context: Context
                           ) -> AsyncIterator[cmn.GetTokenizerChunk]:
        if self.link.config.model_dir is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "no tokenizer directory: start this front with --model DIR")
        try:
            chunks = await info.tokenizer_chunks(self.link.config.model_dir)
        except FileNotFoundError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        for chunk in chunks:
            yield chunk

    async def SubscribeKvEvents(self, request: cmn.SubscribeKvEventsRequest, context: Context
                                ) -> AsyncIterator[cmn.KvEventBatch]:
        try:
            async for batch in self.kv_relay.subscribe(request.start_sequence_number,
                                                       request.load_records_before_first_batch):
                yield batch
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            if code == grpc.StatusCode.FAILED_PRECONDITION:  # vLLM's answer when they are off
                code = grpc.StatusCode.UNIMPLEMENTED
            await context.abort(code, str(exc.details()))  # type: ignore[attr-defined]


def _responses(output: RequestOutput, stream: bool, num_logprobs: int | None, seen: set[int]
               ) -> list[vpb.GenerateResponse]:
    """What one RequestOutput becomes: per choice a chunk (streamed) and, when it finished, its
    complete (carrying that last delta again, as vLLM's servicer does: smg adds up the chunks);
    not streamed, the completes of the finished request."""
    responses = []
    if not stream:
        if output.finished:
            for completion in output.outputs:
                responses.append(complete_response(output, completion, num_logprobs))
        return responses
    for completion in output.outputs:
        first = completion.index not in seen
        seen.add(completion.index)
        responses.append(chunk_response(output, completion, num_logprobs, first))
        if completion.finish_reason:
            responses.append(complete_response(output, completion, num_logprobs))
    return responses


def _request_span(method: str, request_id: str, context: Context
                  ) -> AbstractContextManager[Any]:
    """The RPC's SERVER span, child of the caller's W3C context (gRPC metadata `traceparent`)."""
    return server_span(f"vllm.grpc.engine.VllmEngine/{method}",
                       context_from_metadata(context.invocation_metadata()),
                       {"rpc.system": "grpc", "rpc.service": "vllm.grpc.engine.VllmEngine",
                        "rpc.method": method, "gen_ai.request.id": request_id})


async def _guarded(context: Context, call: Any) -> Any:
    try:
        return await call
    except (RequestError, ServerUnavailable, grpc.RpcError) as exc:
        await _abort_with(context, exc)


async def _abort_with(context: Context, exc: BaseException) -> None:
    """The gateway's status passed on (INVALID_ARGUMENT stays INVALID_ARGUMENT); a gateway
    nobody answers is UNAVAILABLE, which smg retries on another worker."""
    if isinstance(exc, RequestError):
        await context.abort(exc.code, str(exc))
    if isinstance(exc, ServerUnavailable):
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    if isinstance(exc, grpc.RpcError):
        await context.abort(exc.code(), str(exc.details()))  # type: ignore[attr-defined]
    logger.warning("request failed: %s", exc)
    await context.abort(grpc.StatusCode.INTERNAL, str(exc))
