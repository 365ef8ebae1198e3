"""EngineClient: LLMEngine's methods over the gateway's Inference and Control services,
returning engine_core's dataclasses.

    client = EngineClient("127.0.0.1:50051")
    client.add_request("0", "Hello", SamplingParams(temperature=0.0))
    while client.has_unfinished_requests():
        for output in client.step(): ...
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Generator, Iterable, Iterator
from typing import Any

import grpc

from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.outputs import PoolingRequestOutput, RequestOutput
from strand.engine_core.pooling.params import PoolingParams
from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import control_pb2 as cpb
from strand.services._proto.strand.v1 import control_pb2_grpc, inference_pb2_grpc
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.convert import (
    PromptType,
    any_output_from_pb,
    lora_request_to_pb,
    params_to_pb,
    pooling_params_to_pb,
    prompt_to_pb,
    request_output_from_pb,
)
from strand.services.common.tracing import metadata_from_context
from strand.services.gateway.clients import CLIENT_METADATA

MAX_MESSAGE_BYTES = 256 * 1024**2
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
_USER_ERRORS = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.ALREADY_EXISTS)


class RequestError(ValueError):
    """The gateway refused the input (INVALID_ARGUMENT or ALREADY_EXISTS), as LLMEngine would."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class ServerUnavailable(ConnectionError, grpc.RpcError):
    """No gateway answers at the address (not started, wrong address, TLS mismatch, or gone).

    A ConnectionError naming the address; still a grpc.RpcError (code() UNAVAILABLE) for
    callers that catch those."""

    def __init__(self, target: str, details: str) -> None:
        reason = details.split("last error: ")[-1]
        super().__init__(f"no strand gateway answering at {target} ({reason}); is `strand "
                         f"serve` running on that port, with TLS exactly when the client uses it?")
        self.target = target
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details


class GatewayConnection:
    """What EngineClient and AsyncEngineClient both keep: the channel and its stubs, the caller's
    identity, and the outputs a manual-mode generate() stepped past, which the next step()
    returns first."""

    def __init__(self, channel: Any, target: str, api_key: str | None, timeout: float | None,
                 client_id: str | None) -> None:
        self._channel = channel
        self._stub = inference_pb2_grpc.InferenceStub(channel)
        self._control = control_pb2_grpc.ControlStub(channel)
        self._target = target
        self._auth = auth_metadata(api_key, client_id)
        self._timeout = timeout
        self._auto_step: bool | None = None
        self._owed: list[RequestOutput | PoolingRequestOutput] = []

    def _metadata(self) -> list[tuple[str, str]]:
        """Each call's: the client's key and identity, and the caller's trace context."""
        return [*self._auth, *metadata_from_context()]


class EngineClient(GatewayConnection):
    def __init__(self, target: str, api_key: str | None = None,
                 root_certificates: bytes | None = None, timeout: float | None = 300.0,
                 client_id: str | None = None) -> None:
        """client_id: this client's identity at the gateway (metadata x-strand-client; requests
        belong to the client that added them). Default: one of its own, so two EngineClients
        never see each other's outputs; clients that must share requests (a front that aborts
        on a fresh connection) pass the same value."""
        super().__init__(make_channel(grpc, target, root_certificates), target, api_key,
                         timeout, client_id)

    # -- LLMEngine's methods ------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: PromptType,
                    params: SamplingParams | PoolingParams | None = None,
                    arrival_time: float | None = None,
                    lora_request: LoRARequest | None = None, priority: int = 0) -> None:
        """params: a PoolingParams embeds the prompt (a server started with --runner pooling;
        None there: the defaults); step() then returns its PoolingRequestOutput."""
        self._call(self._stub.AddRequest, add_request_message(
            request_id, prompt, params, lora_request, priority, arrival_time))

    def step(self) -> list[RequestOutput | PoolingRequestOutput]:
        owed, self._owed = self._owed, []
        return owed + self._step_pb()[0]

    def abort_request(self, request_ids: str | Iterable[str]) -> None:
        """As LLMEngine: ids that are not running (finished already) are ignored. The gateway
        answers NOT_FOUND for those, after aborting the others."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        try:
            self._stub.Abort(gpb.AbortRequest(request_ids=ids), metadata=self._metadata(),
                             timeout=self._timeout)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:  # type: ignore[attr-defined]
                raise translate(exc, self._target) from exc

    def has_unfinished_requests(self) -> bool:
        return bool(self._call(self._stub.HasUnfinishedRequests,
                               gpb.HasUnfinishedRequestsRequest()).value)

    def get_num_unfinished_requests(self) -> int:
        return int(self._call(self._stub.GetNumUnfinishedRequests,
                              gpb.GetNumUnfinishedRequestsRequest()).value)

    def reset_prefix_cache(self, reset_running_requests: bool = False,
                           reset_connector: bool = False) -> bool:
        msg = gpb.ResetPrefixCacheRequest(reset_running_requests=reset_running_requests,
                                          reset_connector=reset_connector)
        return bool(self._call(self._control.ResetPrefixCache, msg).success)

    def clear_kv_cache(self, instance_id: str, location: str) -> tuple[str, int]:
        """Empty one KV location ("device" or "cpu"): (event id, number of tokens cleared)."""
        resp = self._call(self._control.ClearKvCache,
                          gpb.ClearKvCacheRequest(instance_id=instance_id, location=location))
        return resp.event_id, int(resp.num_tokens_cleared)

    def lookup_kv_cache(self, token_ids: list[int]) -> dict[str, int]:
        """Per location ("device", "cpu"): how many leading tokens of token_ids are cached."""
        bad = [t for t in token_ids if not isinstance(t, int) or isinstance(t, bool)]
        if bad:
            raise ValueError(f"token_ids must be ints, got {bad[:8]}")
        resp = self._call(self._control.LookupKvCache,
                          gpb.LookupKvCacheRequest(token_ids=token_ids))
        return {location: int(n) for location, n in resp.num_cached_tokens.items()}

    def sleep(self, level: int = 1) -> None:
        """LLMEngine.sleep: the engine must be idle; add_request then fails until wake_up."""
        self._call(self._control.Sleep, cpb.SleepRequest(level=level))

    def wake_up(self, tags: list[str] | None = None) -> None:
        self._call(self._control.WakeUp, cpb.WakeUpRequest(tags=tags or []))

    def is_sleeping(self) -> bool:
        return bool(self._call(self._control.IsSleeping, cpb.IsSleepingRequest()).is_sleeping)

    def start_profile(self) -> None:
        self._call(self._control.StartProfile, cpb.StartProfileRequest())

    def stop_profile(self) -> str:
        """The path of the Chrome trace written, on the engine's host."""
        return str(self._call(self._control.StopProfile, cpb.StopProfileRequest()).trace_path)

    def get_supported_tasks(self) -> tuple[str, ...]:
        resp = self._call(self._control.GetSupportedTasks, cpb.GetSupportedTasksRequest())
        return tuple(resp.tasks)

    def add_lora(self, lora_request: LoRARequest) -> bool:
        msg = cpb.AddLoraRequest(lora_request=lora_request_to_pb(lora_request))
        return bool(self._call(self._control.AddLora, msg).success)

    def remove_lora(self, lora_id: int) -> bool:
        return bool(self._call(self._control.RemoveLora,
                               cpb.RemoveLoraRequest(lora_id=lora_id)).success)

    def list_loras(self) -> set[int]:
        return set(self._call(self._control.ListLoras, cpb.ListLorasRequest()).lora_ids)

    def pin_lora(self, lora_id: int) -> bool:
        return bool(self._call(self._control.PinLora, cpb.PinLoraRequest(lora_id=lora_id)).success)

    # -- beyond LLMEngine ---------------------------------------------------------------------

    def get_loads(self) -> list[dict[str, Any]]:
        """Per engine: running and waiting requests, KV blocks used and free, tokens in flight."""
        resp = self._call(self._control.GetLoads, cpb.GetLoadsRequest())
        return [{"engine": load.engine, "num_running": load.num_running,
                 "num_waiting": load.num_waiting, "kv_blocks_used": load.kv_blocks_used,
                 "kv_blocks_free": load.kv_blocks_free,
                 "tokens_in_flight": load.tokens_in_flight} for load in resp.loads]

    def tokenize(self, prompt: PromptType, add_special_tokens: bool | None = None,
                 return_token_strs: bool = False) -> dict[str, Any]:
        """vLLM's /tokenize over gRPC: {"tokens", "count", "max_model_len", "token_strs"} for a
        prompt as a request would carry it (add_special_tokens None: true for text, false for
        chat messages, whose template writes its own); nothing is added to the engine."""
        return tokenized_dict(self._call(self._stub.Tokenize, tokenize_message(
            prompt, add_special_tokens, return_token_strs)))

    def detokenize(self, token_ids: list[int]) -> str:
        """vLLM's /detokenize over gRPC: the text of token ids, special tokens included."""
        resp = self._call(self._stub.Detokenize, pb.DetokenizeRequest(tokens=token_ids))
        return str(resp.prompt)

    def get_server_info(self) -> dict[str, Any]:
        info = self._call(self._control.GetServerInfo, gpb.GetServerInfoRequest())
        self._auto_step = info.auto_step
        return server_info_dict(info)

    def generate(self, prompt: PromptType, params: SamplingParams | None = None,
                 request_id: str | None = None, lora_request: LoRARequest | None = None,
                 priority: int = 0) -> Generator[RequestOutput, None, None]:
        """Yield the request's RequestOutputs until it finishes. Closing the iterator early
        cancels the call, which aborts the request. In manual mode this steps the engine."""
        if self._auto_step is None:
            self.get_server_info()
        msg = generate_request(prompt, params, request_id, lora_request, priority)
        for output in self._generate_pb(msg):
            yield request_output_from_pb(output)

    def embed(self, prompt: PromptType, pooling_params: PoolingParams | None = None,
              request_id: str | None = None, lora_request: LoRARequest | None = None
              ) -> PoolingRequestOutput:
        """The prompt's embedding (a server started with --runner pooling), as LLM.embed
        computes it; RuntimeError when the request ended without one (a stage failed)."""
        msg = generate_request(prompt, pooling_params or PoolingParams(), request_id,
                               lora_request)
        return embedding_of(self._generate_pb(msg))

    def _generate_pb(self, msg: gpb.GenerateRequest
                     ) -> Generator[pb.RequestOutput, None, None]:
        if self._auto_step is None:
            self.get_server_info()
        call = self._stub.Generate(msg, metadata=self._metadata())
        try:
            if self._auto_step:
                yield from _raise_user_errors(call, self._target)
            else:
                yield from self._generate_manual(call)
        finally:
            call.cancel()

    def _generate_manual(self, call: Any) -> Generator[pb.RequestOutput, None, None]:
        try:
            metadata = dict(call.initial_metadata())  # arrives once the request is added
        except grpc.RpcError as exc:
            raise translate(exc, self._target) from exc
        request_id = metadata.get("strand-request-id", "")
        inbox: queue.Queue[pb.RequestOutput | BaseException | None] = queue.Queue()
        reader = threading.Thread(target=_drain, args=(call, inbox, self._target), daemon=True)
        reader.start()
        while True:
            # Endings that need no Step (abort elsewhere, a lost stage) may already be here.
            waiting = [*_take_all(inbox)]
            if not waiting:
                try:
                    outputs, streamed = self._step_pb()
                except grpc.RpcError as exc:
                    # A lost stage ends the request on its stream shortly; else re-raise.
                    try:
                        waiting = [inbox.get(timeout=5.0)]
                    except queue.Empty:
                        raise exc from None
                else:
                    self._owed.extend(outputs)
                    if request_id in streamed:
                        waiting = [inbox.get()]  # this step's output is on its way
            for item in waiting:
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finished:
                    return

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -----------------------------------------------------------------------------

    def _step_pb(self) -> tuple[list[RequestOutput | PoolingRequestOutput], list[str]]:
        # Paged by the gateway to what this client reads; the rest comes with the next step().
        resp = self._call(self._stub.Step, gpb.StepRequest(max_response_bytes=MAX_MESSAGE_BYTES))
        return ([any_output_from_pb(o) for o in resp.outputs],
                list(resp.streamed_request_ids))

    def _call(self, method: Any, msg: Any) -> Any:
        try:
            return method(msg, metadata=self._metadata(), timeout=self._timeout)
        except grpc.RpcError as exc:
            raise translate(exc, self._target) from exc


def auth_metadata(api_key: str | None, client_id: str | None) -> list[tuple[str, str]]:
    """The metadata every call of one client carries: its key and its identity."""
    auth = [("authorization", f"Bearer {api_key}")] if api_key else []
    auth.append((CLIENT_METADATA, client_id or f"client-{uuid.uuid4().hex}"))
    return auth


def make_channel(api: Any, target: str, root_certificates: bytes | None) -> Any:
    """A channel to the gateway from `api` (grpc, or grpc.aio), TLS when given root
    certificates, with the clients' message limits."""
    if root_certificates is not None:
        creds = grpc.ssl_channel_credentials(root_certificates)
        return api.secure_channel(target, creds, options=CHANNEL_OPTIONS)
    return api.insecure_channel(target, options=CHANNEL_OPTIONS)


def add_request_message(request_id: str, prompt: PromptType,
                        params: SamplingParams | PoolingParams | None,
                        lora_request: LoRARequest | None, priority: int,
                        arrival_time: float | None) -> gpb.AddRequestRequest:
    msg = gpb.AddRequestRequest(request_id=request_id, prompt=prompt_to_pb(prompt),
                                priority=priority)
    _set_params(msg, params)
    if lora_request is not None:
        msg.lora_request.CopyFrom(lora_request_to_pb(lora_request))
    if arrival_time is not None:
        msg.arrival_time = arrival_time
    return msg


def generate_request(prompt: PromptType, params: SamplingParams | PoolingParams | None,
                     request_id: str | None, lora_request: LoRARequest | None, priority: int = 0
                     ) -> gpb.GenerateRequest:
    msg = gpb.GenerateRequest(request_id=request_id or "", prompt=prompt_to_pb(prompt),
                              priority=priority)
    _set_params(msg, params)
    if lora_request is not None:
        msg.lora_request.CopyFrom(lora_request_to_pb(lora_request))
    return msg


def _set_params(msg: gpb.AddRequestRequest | gpb.GenerateRequest,
                params: SamplingParams | PoolingParams | None) -> None:
    """An embedding request's PoolingParams, or the SamplingParams; neither when None (the
    server's defaults for what its engine does)."""
    if isinstance(params, PoolingParams):
        msg.pooling_params.CopyFrom(pooling_params_to_pb(params))
    elif params is not None:
        msg.params.CopyFrom(params_to_pb(params))


def embedding_of(outputs: Iterable[pb.RequestOutput]) -> PoolingRequestOutput:
    """The one output of an embedding request's Generate stream."""
    for msg in outputs:
        output = any_output_from_pb(msg)
        if isinstance(output, PoolingRequestOutput):
            return output
        if output.finished:
            raise RuntimeError(f"request {output.request_id} ended without an embedding: "
                               f"{output.error or output.outputs[0].finish_reason}")
    raise RuntimeError("the embedding request's stream ended without an output")


def tokenize_message(prompt: PromptType, add_special_tokens: bool | None,
                     return_token_strs: bool) -> pb.TokenizeRequest:
    msg = pb.TokenizeRequest(prompt=prompt_to_pb(prompt), return_token_strs=return_token_strs)
    if add_special_tokens is not None:
        msg.add_special_tokens = add_special_tokens
    return msg


def tokenized_dict(resp: pb.TokenizeResponse) -> dict[str, Any]:
    return {"tokens": list(resp.tokens), "count": resp.count,
            "max_model_len": resp.max_model_len,
            "token_strs": list(resp.token_strs) if resp.token_strs else None}


def server_info_dict(info: gpb.GetServerInfoResponse) -> dict[str, Any]:
    return {"model": info.model, "max_model_len": info.max_model_len,
            "block_size": info.block_size, "num_blocks": info.num_blocks,
            "vocab_size": info.vocab_size, "auto_step": info.auto_step,
            "dtype": info.dtype, "kv_cache_dtype": info.kv_cache_dtype,
            "labels": list(info.labels), "versions": dict(info.versions)}


def translate(exc: grpc.RpcError, target: str) -> Exception:
    code = exc.code()  # type: ignore[attr-defined]
    if code in _USER_ERRORS:
        return RequestError(code, exc.details())  # type: ignore[attr-defined]
    details = str(exc.details())  # type: ignore[attr-defined]
    if code == grpc.StatusCode.UNAVAILABLE and details.lower().startswith("failed to connect"):
        # Nothing listens there: say so, instead of a raw _InactiveRpcError. (Only gRPC's own
        # words: "engine stage is unavailable: failed to connect ..." is the gateway's answer.)
        return ServerUnavailable(target, details)
    return exc


def _raise_user_errors(call: Any, target: str) -> Iterator[pb.RequestOutput]:
    try:
        yield from call
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.CANCELLED:  # type: ignore[attr-defined]
            return
        raise translate(exc, target) from exc


def _take_all(inbox: queue.Queue[Any]) -> list[Any]:
    items = []
    while True:
        try:
            items.append(inbox.get_nowait())
        except queue.Empty:
            return items


def _drain(call: Any, inbox: queue.Queue[pb.RequestOutput | BaseException | None],
           target: str) -> None:
    try:
        for output in call:
            inbox.put(output)
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.CANCELLED:  # type: ignore[attr-defined]
            inbox.put(translate(exc, target))
    inbox.put(None)
