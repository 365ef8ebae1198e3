"""AsyncEngineClient: EngineClient's requests for asyncio programs, on one grpc.aio channel.

    async with AsyncEngineClient("127.0.0.1:50051") as client:
        async for output in client.generate("Hello", SamplingParams(max_tokens=8)): ...

EngineClient blocks, so a program with many requests in flight gives each its own thread, and
gRPC's blocking reads wake every waiting thread ten times a second (grpc._common's
MAXIMUM_WAIT_TIMEOUT): CPU taken from the engine where the two share cores. Here each request is
a coroutine on one channel (one connection), with no thread of its own and nothing woken while
it waits. The OpenAI front serves every HTTP request through one of these. A grpc.aio channel
belongs to the event loop it was made on: make the client inside the loop that uses it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from typing import Any

import grpc

from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.outputs import PoolingRequestOutput, RequestOutput
from strand.engine_core.pooling.params import PoolingParams
from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.client import (
    MAX_MESSAGE_BYTES,
    GatewayConnection,
    add_request_message,
    embedding_of,
    generate_request,
    make_channel,
    server_info_dict,
    tokenize_message,
    tokenized_dict,
    translate,
)
from strand.services.common.convert import PromptType, any_output_from_pb, request_output_from_pb


class AsyncEngineClient(GatewayConnection):
    def __init__(self, target: str, api_key: str | None = None,
                 root_certificates: bytes | None = None, timeout: float | None = 300.0,
                 client_id: str | None = None) -> None:
        """As EngineClient's; timeout bounds the unary calls, not a generate() stream."""
        super().__init__(make_channel(grpc.aio, target, root_certificates), target, api_key,
                         timeout, client_id)

    async def generate(self, prompt: PromptType, params: SamplingParams | None = None,
                       request_id: str | None = None, lora_request: LoRARequest | None = None,
                       priority: int = 0, timeout: float | None = None
                       ) -> AsyncGenerator[RequestOutput, None]:
        """The request's RequestOutputs until it finishes. Leaving the iteration early (break,
        cancellation) cancels the call, which aborts the request. In manual mode this steps.
        timeout: seconds for the whole stream, the call's gRPC deadline, which the gateway
        hands to the engine (it ends the request there, finish_reason "abort", once past)."""
        if self._auto_step is None:
            await self.get_server_info()
        call = self._stub.Generate(generate_request(prompt, params, request_id, lora_request,
                                                    priority),
                                   metadata=self._metadata(), timeout=timeout)
        outputs = self._streamed(call) if self._auto_step else self._stepped(call)
        try:
            async for output in outputs:
                yield request_output_from_pb(output)
        finally:
            call.cancel()

    async def embed(self, prompt: PromptType, pooling_params: PoolingParams | None = None,
                    request_id: str | None = None, lora_request: LoRARequest | None = None
                    ) -> PoolingRequestOutput:
        """As EngineClient.embed: the prompt's embedding (a server with --runner pooling)."""
        if self._auto_step is None:
            await self.get_server_info()
        call = self._stub.Generate(generate_request(prompt, pooling_params or PoolingParams(),
                                                    request_id, lora_request),
                                   metadata=self._metadata())
        try:
            outputs = self._streamed(call) if self._auto_step else self._stepped(call)
            return embedding_of([output async for output in outputs])
        finally:
            call.cancel()

    async def add_request(self, request_id: str, prompt: PromptType,
                          params: SamplingParams | PoolingParams | None = None,
                          arrival_time: float | None = None,
                          lora_request: LoRARequest | None = None, priority: int = 0) -> None:
        await self._call(self._stub.AddRequest, add_request_message(
            request_id, prompt, params, lora_request, priority, arrival_time))

    async def step(self) -> list[RequestOutput | PoolingRequestOutput]:
        owed, self._owed = self._owed, []
        return owed + (await self._step_pb())[0]

    async def abort_request(self, request_ids: str | Iterable[str]) -> None:
        """As EngineClient.abort_request: ids that are not running are ignored."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        try:
            await self._stub.Abort(gpb.AbortRequest(request_ids=ids), metadata=self._metadata(),
                                   timeout=self._timeout)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:  # type: ignore[attr-defined]
                raise translate(exc, self._target) from exc

    async def has_unfinished_requests(self) -> bool:
        return bool((await self._call(self._stub.HasUnfinishedRequests,
                                      gpb.HasUnfinishedRequestsRequest())).value)

    async def tokenize(self, prompt: PromptType, add_special_tokens: bool | None = None,
                       return_token_strs: bool = False) -> dict[str, Any]:
        """EngineClient.tokenize (vLLM's /tokenize) on this channel."""
        return tokenized_dict(await self._call(self._stub.Tokenize, tokenize_message(
            prompt, add_special_tokens, return_token_strs)))

    async def detokenize(self, token_ids: list[int]) -> str:
        """EngineClient.detokenize (vLLM's /detokenize) on this channel."""
        resp = await self._call(self._stub.Detokenize, pb.DetokenizeRequest(tokens=token_ids))
        return str(resp.prompt)

    async def get_server_info(self) -> dict[str, Any]:
        info = await self._call(self._control.GetServerInfo, gpb.GetServerInfoRequest())
        self._auto_step = info.auto_step
        return server_info_dict(info)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncEngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- plumbing -----------------------------------------------------------------------------

    async def _streamed(self, call: Any) -> AsyncIterator[pb.RequestOutput]:
        """Auto mode: the stream's outputs, until the last."""
        try:
            async for output in call:
                yield output
                if output.finished:
                    return
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:  # type: ignore[attr-defined]
                raise translate(exc, self._target) from exc

    async def _stepped(self, call: Any) -> AsyncIterator[pb.RequestOutput]:
        """Manual mode: Step while the request's stream has nothing waiting (EngineClient's
        loop); a step that streamed to this request has its output on the way."""
        try:
            request_id = dict(await call.initial_metadata()).get("strand-request-id", "")
        except grpc.RpcError as exc:
            raise translate(exc, self._target) from exc
        inbox: asyncio.Queue[pb.RequestOutput | BaseException | None] = asyncio.Queue()
        reader = asyncio.get_running_loop().create_task(self._drain(call, inbox))
        try:
            while True:
                # Endings that need no Step (abort elsewhere, a lost stage) may already be here.
                waiting = _take_all(inbox)
                if not waiting:
                    try:
                        outputs, streamed = await self._step_pb()
                    except grpc.RpcError as exc:
                        # A lost stage ends the request on its stream shortly; else re-raise.
                        try:
                            waiting = [await asyncio.wait_for(inbox.get(), 5.0)]
                        except TimeoutError:
                            raise exc from None
                    else:
                        self._owed.extend(outputs)
                        if request_id in streamed:
                            waiting = [await inbox.get()]  # this step's output is on its way
                for item in waiting:
                    if item is None:
                        return
                    if isinstance(item, BaseException):
                        raise item
                    yield item
                    if item.finished:
                        return
        finally:
            reader.cancel()

    async def _drain(self, call: Any,
                     inbox: asyncio.Queue[pb.RequestOutput | BaseException | None]) -> None:
        try:
            async for output in call:
                inbox.put_nowait(output)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.CANCELLED:  # type: ignore[attr-defined]
                inbox.put_nowait(translate(exc, self._target))
        inbox.put_nowait(None)

    async def _step_pb(self) -> tuple[list[RequestOutput | PoolingRequestOutput], list[str]]:
        resp = await self._call(self._stub.Step,
                                gpb.StepRequest(max_response_bytes=MAX_MESSAGE_BYTES))
        return ([any_output_from_pb(o) for o in resp.outputs],
                list(resp.streamed_request_ids))

    async def _call(self, method: Any, msg: Any) -> Any:
        try:
            return await method(msg, metadata=self._metadata(), timeout=self._timeout)
        except grpc.RpcError as exc:
            raise translate(exc, self._target) from exc


def _take_all(inbox: asyncio.Queue[Any]) -> list[Any]:
    items = []
    while not inbox.empty():
        items.append(inbox.get_nowait())
    return items
