"""Gateway servicer: every RPC is a few lines around one GatewayFlow call. One object serves
strand.v1.Inference, strand.v1.Control and the deprecated strand.v1.Gateway (their methods
share names and messages)."""

from __future__ import annotations

import asyncio
import platform
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc

from strand.engine_core.core.expiry import QUEUE_TIME_REASON
from strand.services._proto.strand.v1 import control_pb2 as cpb
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import gateway_pb2_grpc
from strand.services._proto.strand.v1 import tokenizer_pb2 as tpb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.status import StageError, status_of
from strand.services.common.tracing import context_from_metadata, server_span
from strand.services.gateway.clients import client_identity
from strand.services.gateway.engine_control import ENGINE_CONTROL_METHODS, EngineControlRpcs
from strand.services.gateway.flow import GatewayFlow
from strand.services.gateway.replica_reports import replica_infos
from strand.services.gateway.stream_outputs import StreamOutputs

T = TypeVar("T")
_CONTROL_METHODS = frozenset({"ResetPrefixCache", "ClearKvCache", "LookupKvCache",
                              "GetServerInfo", "GetLoads", "SubscribeKvEvents",
                              "AddLora", "RemoveLora", "ListLoras", "PinLora"}
                             ) | ENGINE_CONTROL_METHODS


class GatewayServicer(EngineControlRpcs, gateway_pb2_grpc.GatewayServicer):
    def __init__(self, flow: GatewayFlow, authenticated: bool = False) -> None:
        self.flow = flow
        self.control = flow.control
        self.authenticated = authenticated  # an api key is required (identities follow it)

    def client(self, context: grpc.aio.ServicerContext) -> str:
        """Who is calling: requests belong to the client that added them."""
        return client_identity(context.invocation_metadata() or (), context.peer(),
                               self.authenticated)

    async def _traced(self, name: str, context: grpc.aio.ServicerContext,
                      body: Callable[[], Awaitable[T]]) -> T:
        parent = context_from_metadata(context.invocation_metadata())
        service = "Control" if name in _CONTROL_METHODS else "Inference"
        with server_span(f"strand.v1.{service}/{name}", parent) as span:
            try:
                return await body()
            except (StageError, ValueError) as exc:
                code, message = status_of(exc)
                span.set_attribute("rpc.grpc.status_code", code.value[0])
                await context.abort(code, message)
                raise  # unreachable: abort raises

    async def AddRequest(self, request: gpb.AddRequestRequest,
                         context: grpc.aio.ServicerContext) -> gpb.AddRequestResponse:
        async def body() -> gpb.AddRequestResponse:
            arrival = request.arrival_time if request.HasField("arrival_time") else None
            await self.flow.add_request(self.client(context), request.request_id,
                                        request.prompt, request.params, arrival,
                                        request.priority, lora_request=_lora_of(request),
                                        pooling=_pooling_of(request),
                                        deadline=deadline_of(context))
            return gpb.AddRequestResponse()
        return await self._traced("AddRequest", context, body)

    async def Step(self, request: gpb.StepRequest,
                   context: grpc.aio.ServicerContext) -> gpb.StepResponse:
        async def body() -> gpb.StepResponse:
            limit = (request.max_response_bytes if request.HasField("max_response_bytes")
                     else None)
            outputs, streamed, num_pending = await self.flow.step(self.client(context), limit)
            return gpb.StepResponse(outputs=outputs, streamed_request_ids=streamed,
                                    num_pending=num_pending)
        return await self._traced("Step", context, body)

    async def Abort(self, request: gpb.AbortRequest,
                    context: grpc.aio.ServicerContext) -> gpb.AbortResponse:
        async def body() -> gpb.AbortResponse:
            await self.flow.abort(self.client(context), list(request.request_ids))
            return gpb.AbortResponse()
        return await self._traced("Abort", context, body)

    async def ResetPrefixCache(self, request: gpb.ResetPrefixCacheRequest,
                               context: grpc.aio.ServicerContext
                               ) -> gpb.ResetPrefixCacheResponse:
        async def body() -> gpb.ResetPrefixCacheResponse:
            return await self.control.reset_prefix_cache(request.reset_running_requests,
                                                      request.reset_connector)
        return await self._traced("ResetPrefixCache", context, body)

    async def HasUnfinishedRequests(self, request: gpb.HasUnfinishedRequestsRequest,
                                    context: grpc.aio.ServicerContext
                                    ) -> gpb.HasUnfinishedRequestsResponse:
        async def body() -> gpb.HasUnfinishedRequestsResponse:
            num = await self.flow.get_num_unfinished_requests(self.client(context))
            return gpb.HasUnfinishedRequestsResponse(value=num > 0)
        return await self._traced("HasUnfinishedRequests", context, body)

    async def GetNumUnfinishedRequests(self, request: gpb.GetNumUnfinishedRequestsRequest,
                                       context: grpc.aio.ServicerContext
                                       ) -> gpb.GetNumUnfinishedRequestsResponse:
        async def body() -> gpb.GetNumUnfinishedRequestsResponse:
            num = await self.flow.get_num_unfinished_requests(self.client(context))
            return gpb.GetNumUnfinishedRequestsResponse(value=num)
        return await self._traced("GetNumUnfinishedRequests", context, body)

    async def Tokenize(self, request: pb.TokenizeRequest,
                       context: grpc.aio.ServicerContext) -> pb.TokenizeResponse:
        async def body() -> pb.TokenizeResponse:
            answer = await self.flow.tokenizer_lookup(tpb.TokenizerRequest(tokenize=request))
            return answer.tokenized
        return await self._traced("Tokenize", context, body)

    async def Detokenize(self, request: pb.DetokenizeRequest,
                         context: grpc.aio.ServicerContext) -> pb.DetokenizeResponse:
        async def body() -> pb.DetokenizeResponse:
            answer = await self.flow.tokenizer_lookup(tpb.TokenizerRequest(detokenize=request))
            return answer.detokenized
        return await self._traced("Detokenize", context, body)

    async def ClearKvCache(self, request: gpb.ClearKvCacheRequest,
                           context: grpc.aio.ServicerContext) -> gpb.ClearKvCacheResponse:
        async def body() -> gpb.ClearKvCacheResponse:
            return await self.control.clear_kv_cache(request.instance_id, request.location)
        return await self._traced("ClearKvCache", context, body)

    async def LookupKvCache(self, request: gpb.LookupKvCacheRequest,
                            context: grpc.aio.ServicerContext) -> gpb.LookupKvCacheResponse:
        async def body() -> gpb.LookupKvCacheResponse:
            return await self.control.lookup_kv_cache(list(request.token_ids))
        return await self._traced("LookupKvCache", context, body)

    async def GetServerInfo(self, request: gpb.GetServerInfoRequest,
                            context: grpc.aio.ServicerContext) -> gpb.GetServerInfoResponse:
        async def body() -> gpb.GetServerInfoResponse:
            info = await self.flow.engine_info()
            replicas = replica_infos(await self.flow.engine_infos(),
                                     self.flow.engines.in_rotation())
            return gpb.GetServerInfoResponse(
                model=info.model, max_model_len=info.max_model_len, block_size=info.block_size,
                num_blocks=sum(r.num_blocks for r in replicas), vocab_size=info.vocab_size,
                auto_step=info.auto_step, versions=_versions(), replicas=replicas,
                dtype=info.dtype, kv_cache_dtype=info.kv_cache_dtype, labels=info.labels)
        return await self._traced("GetServerInfo", context, body)

    async def GetLoads(self, request: cpb.GetLoadsRequest,
                       context: grpc.aio.ServicerContext) -> cpb.GetLoadsResponse:
        async def body() -> cpb.GetLoadsResponse:
            return cpb.GetLoadsResponse(loads=await self.control.get_loads())
        return await self._traced("GetLoads", context, body)

    async def SubscribeKvEvents(self, request: cpb.SubscribeKvEventsRequest,
                                context: grpc.aio.ServicerContext
                                ) -> AsyncIterator[pb.KvEventBatch]:
        try:
            resume = _resume_points(request, self.flow.engines.names)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            async for batch in self.control.kv_events(resume):
                yield batch
        except StageError as exc:
            code, message = status_of(exc)
            await context.abort(code, message)

    # -- LoRA adapters (issue 22 item 2): each RPC is one EngineCore call ------------------------

    async def _lora(self, name: str, call: epb.EngineLoraCall,
                    context: grpc.aio.ServicerContext) -> cpb.LoraResponse:
        async def body() -> cpb.LoraResponse:
            result = await self.control.lora(call)
            return cpb.LoraResponse(success=result.success, lora_ids=result.lora_ids)
        return await self._traced(name, context, body)

    async def AddLora(self, request: cpb.AddLoraRequest,
                      context: grpc.aio.ServicerContext) -> cpb.LoraResponse:
        return await self._lora("AddLora", epb.EngineLoraCall(add=request.lora_request),
                                context)

    async def RemoveLora(self, request: cpb.RemoveLoraRequest,
                         context: grpc.aio.ServicerContext) -> cpb.LoraResponse:
        return await self._lora("RemoveLora", epb.EngineLoraCall(remove=request.lora_id),
                                context)

    async def ListLoras(self, request: cpb.ListLorasRequest,
                        context: grpc.aio.ServicerContext) -> cpb.LoraResponse:
        return await self._lora("ListLoras", epb.EngineLoraCall(list=epb.EngineLoraCall.List()),
                                context)

    async def PinLora(self, request: cpb.PinLoraRequest,
                      context: grpc.aio.ServicerContext) -> cpb.LoraResponse:
        return await self._lora("PinLora", epb.EngineLoraCall(pin=request.lora_id), context)

    async def Generate(self, request: gpb.GenerateRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[pb.RequestOutput]:
        request_id = request.request_id or f"gen-{uuid.uuid4().hex}"
        # A client reading slower than its DELTA outputs come gets them merged, not queued.
        queue = StreamOutputs(aggregate=request.params.output_kind == pb.DELTA)

        async def add() -> str:
            return await self.flow.add_request(self.client(context), request_id,
                                               request.prompt, request.params, None,
                                               request.priority, queue=queue,
                                               lora_request=_lora_of(request),
                                               pooling=_pooling_of(request),
                                               deadline=deadline_of(context))
        internal = await self._traced("Generate", context, add)
        finished = False
        try:
            # Tells the client the request is in (and its id), so it may Step in manual mode.
            # Inside the try: a client gone by now fails this send (or cancels it), and its
            # request must be aborted like one that leaves later.
            await context.send_initial_metadata((("strand-request-id", request_id),))
            while True:
                output = await queue.get()
                finished = output.finished
                overloaded = queue_time_ending(output)
                if overloaded is not None:
                    # Nothing computed: the caller learns it as overload, to retry elsewhere.
                    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, overloaded)
                yield output
                if finished:
                    return
        finally:
            if not finished:
                # The client went away (cancelled, deadline): the request must not run on.
                asyncio.get_running_loop().create_task(self._abort_quietly(internal))

    async def _abort_quietly(self, request_id: str) -> None:
        try:
            await self.flow.abort_internal([request_id])
        except StageError:
            pass  # the stage that would hold it is gone, and with it the request


def _versions() -> dict[str, str]:
    from importlib import metadata

    versions = {"python": platform.python_version(), "grpc": grpc.__version__}
    for dist in ("strand", "torch", "protobuf"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = "unknown"
    return versions


def _resume_points(request: cpb.SubscribeKvEventsRequest, engines: list[str]
                   ) -> dict[str, tuple[int, str]]:
    """Per engine, (the seq of the first batch wanted, its epoch); ValueError naming the field
    for an engine this gateway does not have, or one named twice."""
    points: dict[str, tuple[int, str]] = {}
    for i, point in enumerate(request.resume):
        if point.engine not in engines:
            raise ValueError(f"resume[{i}].engine must be one of {engines}, "
                             f"got {point.engine!r}")
        if point.engine in points:
            raise ValueError(f"resume[{i}].engine names {point.engine!r} a second time")
        points[point.engine] = (point.start_sequence_number, point.epoch)
    return points


def queue_time_ending(output: pb.RequestOutput) -> str | None:
    """The message for a request the engine ended because it waited longer than
    --max-queue-time before its first step, with no token made; None for any other output."""
    if not output.finished or not output.outputs:
        return None
    for completion in output.outputs:
        if (completion.finish_reason != "abort" or completion.token_ids
                or completion.WhichOneof("stop_reason") != "stop_str"
                or completion.stop_str != QUEUE_TIME_REASON):
            return None
    return (f"request {output.request_id} waited longer than the engine's --max-queue-time "
            "before its first step (the server is overloaded); nothing was computed")


def deadline_of(context: grpc.aio.ServicerContext) -> float | None:
    """The call's gRPC deadline as wall-clock time (it travels to the engine); None: none."""
    remaining = context.time_remaining()
    return None if remaining is None else time.time() + remaining


def _lora_of(request: gpb.AddRequestRequest | gpb.GenerateRequest) -> pb.LoRARequest | None:
    return request.lora_request if request.HasField("lora_request") else None


def _pooling_of(request: gpb.AddRequestRequest | gpb.GenerateRequest) -> pb.PoolingParams | None:
    return request.pooling_params if request.HasField("pooling_params") else None
