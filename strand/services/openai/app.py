"""The FastAPI app: /v1/completions, /v1/chat/completions, /v1/responses, /v1/embeddings,
/classify, /score, /rerank, /v1/models, /tokenize, /detokenize, /health, /version, /metrics."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry.trace import Span
from pydantic import BaseModel

from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import SamplingParams
from strand.services.async_client import AsyncEngineClient
from strand.services.common.convert import PromptType
from strand.services.openai import params as convert
from strand.services.openai import scoring
from strand.services.openai.api_key import ApiKeyCheck
from strand.services.openai.body_limit import DEFAULT_MAX_BODY_BYTES, BodyLimit
from strand.services.openai.client_timeout import client_timeout_s
from strand.services.openai.drain import Draining, DrainState
from strand.services.openai.echo import prepare_echo
from strand.services.openai.embeddings import EmbeddingRequest
from strand.services.openai.embeddings import embeddings as embedding_answer
from strand.services.openai.errors import OpenAIError, bad_request, from_exception, model_not_found
from strand.services.openai.metrics import FrontMetrics, HttpMetrics
from strand.services.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
    _Sampling,
)
from strand.services.openai.reasoning import reasoning_of
from strand.services.openai.responses import ResponsesShape, response_base
from strand.services.openai.responses_input import (
    ResponsesRequest,
    chat_request,
    said_of_responses,
    sampling_extras,
)
from strand.services.openai.shaping import ChatEvents, Shaper
from strand.services.openai.streams import Job, OutputStream, final_outputs
from strand.services.openai.structured import constraint_source, said_of_constraint
from strand.services.openai.tools import said_of_tools, tool_choice
from strand.services.openai.tracing import end_request_span, start_request_span

log = logging.getLogger(__name__)
# A pooling route's answer (embeddings.py, scoring.py): the front, the request, the model name
# answered with and the adapter it names.
PoolingRoute = Callable[[Any, Any, str, LoRARequest | None], Awaitable[dict[str, Any]]]


@dataclass(slots=True)
class FrontConfig:
    gateway: str  # host:port of the strand gateway
    api_key: str | None = None  # required of HTTP clients and passed on to the gateway
    root_certificates: bytes | None = None  # the gateway's TLS roots, when it serves TLS
    # The names clients use, the first the one /v1/models lists first and a request naming none
    # is answered with (vLLM's --served-model-name); empty: the model the gateway reports.
    served_model_names: list[str] = field(default_factory=list)
    # --lora-modules: model name -> the adapter a request naming it runs with.
    lora_modules: dict[str, LoRARequest] = field(default_factory=dict)
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # a larger request body is a 413, unread
    # --enable-auto-tool-choice --tool-call-parser: tool_choice "auto" parsed so (tool_parser.py)
    tool_call_parser: str | None = None
    # --reasoning-parser: a thinking model's reasoning answered apart (reasoning.py)
    reasoning_parser: str | None = None
    # --enable-prompt-tokens-details: usage.prompt_tokens_details.cached_tokens (vLLM's flag)
    prompt_tokens_details: bool = False


class Front:
    def __init__(self, config: FrontConfig) -> None:
        self.config = config
        self._names: list[str] = list(config.served_model_names)
        self._info: dict[str, Any] | None = None
        self._client_id = f"openai-front-{uuid.uuid4().hex}"

        self._client: AsyncEngineClient | None = None

    def client(self) -> AsyncEngineClient:
        """The front's one gateway client: every HTTP request's engine requests are coroutines
        on its one channel (made on first use, inside the server's event loop). A channel per
        request cost a connection and a GetServerInfo call before each Generate; a thread per
        request, gRPC's wake-ups of every blocked reader ten times a second."""
        if self._client is None:
            self._client = AsyncEngineClient(
                self.config.gateway, api_key=self.config.api_key,
                root_certificates=self.config.root_certificates, timeout=30,
                client_id=self._client_id)
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def info(self) -> dict[str, Any]:
        if self._info is None:
            self._info = await self.client().get_server_info()
            self._names = self._names or [str(self._info["model"])]
        return self._info

    async def model_names(self) -> list[str]:
        await self.info()
        return self._names

    async def check_model(self, requested: str | None) -> tuple[str, LoRARequest | None]:
        """(the model name answered with, the adapter when the name is a LoRA module). As in
        vLLM, a request naming one of the served names is answered with the name it used."""
        names = await self.model_names()
        if requested is None:
            return names[0], None
        if requested in self.config.lora_modules:
            return requested, self.config.lora_modules[requested]
        # A name that is a path may be spelled differently ("./models/tiny/" for the gateway's
        # "models/tiny"): either spelling names it.
        for name in names:
            if os.path.normpath(requested) == os.path.normpath(name):
                return name, None
        raise model_not_found(requested)


def create_app(config: FrontConfig, drain: DrainState | None = None) -> FastAPI:
    """The app; `drain` is set by the server that drains it on a signal (drain.py)."""
    front = Front(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await front.close()

    app = FastAPI(title="strand OpenAI-compatible API", lifespan=lifespan)

    @app.exception_handler(OpenAIError)
    async def _openai_error(request: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":  # its loc is a byte offset, not a field
            error = first.get("ctx", {}).get("error", "invalid JSON")
            return bad_request(f"body is not valid JSON: {error}", None).response()
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        message = f"{'.'.join(loc) or 'body'}: {first.get('msg', 'invalid request')}"
        return bad_request(message, loc[0] if loc else None).response()

    async def _known(request: Request, exc: Exception) -> JSONResponse:
        return from_exception(exc).response()

    # What a request may meet on its way (refused input, the gateway's statuses) is answered
    # where the route is: Starlette's handler for Exception answers too, but then re-raises
    # for the server's log, and uvicorn closes the connection: a keep-alive client's next
    # request on it failed with a connection error.
    for known in (ValueError, grpc.RpcError, ConnectionError):
        app.add_exception_handler(known, _known)

    @app.exception_handler(Exception)
    async def _any(request: Request, exc: Exception) -> JSONResponse:
        return from_exception(exc).response()  # a bug: a 500, logged, the connection closed

    # Added first, so inside the key check: a client without the key is refused unread.
    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    if config.api_key:
        app.add_middleware(ApiKeyCheck, key=config.api_key)
    # Outside the key check: a draining front refuses every request alike.
    app.add_middleware(Draining, state=drain if drain is not None else DrainState())
    metrics = FrontMetrics()
    app.add_middleware(HttpMetrics, metrics=metrics)  # outermost: refusals counted too

    @app.get("/metrics")
    async def prometheus() -> Response:
        body, content_type = metrics.text()
        return Response(body, media_type=content_type)

    @app.get("/health")
    async def health() -> Response:
        try:
            await front.client().has_unfinished_requests()
        except Exception as exc:  # noqa: BLE001
            return from_exception(exc).response()
        return Response(status_code=200)

    @app.get("/version")
    async def version() -> dict[str, str]:
        """vLLM's /version: this front's package version (the gateway's stages report theirs
        in GetServerInfo)."""
        from importlib import metadata

        try:
            return {"version": metadata.version("strand")}
        except metadata.PackageNotFoundError:
            return {"version": "unknown"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        info = await front.info()
        names = await front.model_names()
        created = int(time.time())
        served = [{"id": name, "object": "model", "created": created, "owned_by": "strand",
                   "root": info["model"], "max_model_len": info["max_model_len"]}
                  for name in names]
        adapters = [{"id": name, "object": "model", "created": created, "owned_by": "strand",
                     "root": lora.lora_path, "parent": names[0],
                     "max_model_len": info["max_model_len"]}
                    for name, lora in config.lora_modules.items()]
        return {"object": "list", "data": [*served, *adapters]}

    @app.post("/v1/completions", response_model=None)
    async def completions(req: CompletionRequest, request: Request) -> Response:
        _warn_ignored(req, "/v1/completions")
        model, lora = await front.check_model(req.model)
        params = convert.completion_params(req)
        prompts = convert.completion_prompts(req)
        echo = (await prepare_echo(front.client(), prompts, convert.echo_only(req),
                                   req.logprobs is not None) if req.echo else None)
        shaper = Shaper(chat=False, model=model, n=req.n, id=f"cmpl-{uuid.uuid4().hex}",
                        echo=echo, prompt_logprobs=req.prompt_logprobs is not None,
                        token_details=front.config.prompt_tokens_details)
        try:
            return await _serve(front, req, shaper, convert.salted(prompts, req.cache_salt),
                                params, lora, request)
        except (OpenAIError, ValueError) as exc:
            raise said_of_constraint(from_exception(exc), constraint_source(req)) from None

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(req: ChatCompletionRequest, request: Request) -> Response:
        _warn_ignored(req, "/v1/chat/completions")
        model, lora = await front.check_model(req.model)
        tool = tool_choice(req, front.config.tool_call_parser)
        shaper = Shaper(chat=True, model=model, n=req.n, num_top_logprobs=req.top_logprobs or 0,
                        id=f"chatcmpl-{uuid.uuid4().hex}",
                        prompt_logprobs=req.prompt_logprobs is not None, tool=tool,
                        one_call=req.parallel_tool_calls is False,
                        reasoning=reasoning_of(req, front.config.reasoning_parser),
                        token_details=front.config.prompt_tokens_details,
                        chat_echo=convert.chat_echo(req))
        params = convert.chat_params(req, tool)
        prompt = convert.chat_prompt(req.messages, req.add_generation_prompt, req.tools,
                                     convert.template_kwargs_of(req),
                                     req.continue_final_message)
        try:
            return await _serve(front, req, shaper, convert.salted([prompt], req.cache_salt),
                                params, lora, request)
        except (OpenAIError, ValueError) as exc:  # a RequestError is a ValueError
            error = said_of_tools(from_exception(exc), tool)
            raise said_of_constraint(error, constraint_source(req)) from None

    @app.post("/v1/responses", response_model=None)
    async def responses(req: ResponsesRequest, request: Request) -> Response:
        """OpenAI's Responses API over the chat path (responses_input.py, responses.py)."""
        chat = chat_request(req)
        _warn_ignored(req, "/v1/responses", set(sampling_extras(req)))
        model, lora = await front.check_model(chat.model)
        tool = None
        try:
            tool = tool_choice(chat, front.config.tool_call_parser)
            shaper = Shaper(chat=True, model=model, n=1, id=f"resp_{uuid.uuid4().hex}",
                            tool=tool, one_call=chat.parallel_tool_calls is False,
                            reasoning=reasoning_of(chat, front.config.reasoning_parser))
            params = convert.chat_params(chat, tool)
            prompt = convert.chat_prompt(chat.messages, True, chat.tools,
                                         convert.template_kwargs_of(chat))
            reshape = ResponsesShape(response_base(req, model, shaper.id), shaper)
            return await _serve(front, chat, shaper, [prompt], params, lora, request, reshape)
        except (OpenAIError, ValueError) as exc:
            error = said_of_tools(from_exception(exc), tool)
            raise said_of_responses(said_of_constraint(error, constraint_source(chat))) from None

    @app.get("/v1/responses/{response_id}")
    async def stored_response(response_id: str) -> Response:
        raise OpenAIError(404, f"no response {response_id!r}: this server keeps none (send "
                               "the conversation as input)", param="response_id",
                          code="not_found")

    async def pooled(req: Any, path: str, answer: PoolingRoute) -> dict[str, Any]:
        """A pooling route's answer: the model (or adapter) it names, refusals as 400s."""
        _warn_ignored(req, path)
        model, lora = await front.check_model(req.model)
        try:
            return await answer(front, req, model, lora)
        except (OpenAIError, ValueError) as exc:
            raise from_exception(exc) from None

    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest) -> dict[str, Any]:
        """OpenAI's embeddings, from a server started with --runner pooling."""
        return await pooled(req, "/v1/embeddings", embedding_answer)

    @app.post("/classify")
    @app.post("/v1/classify")
    async def classify(req: scoring.ClassifyRequest) -> dict[str, Any]:
        """vLLM's: each input's label probabilities, from a sequence classifier."""
        return await pooled(req, "/classify", scoring.classify)

    @app.post("/score")
    @app.post("/v1/score")
    async def score(req: scoring.ScoreRequest) -> dict[str, Any]:
        """vLLM's: text_1 against text_2 (1:1, 1:N or N:N), one score per pair."""
        return await pooled(req, "/score", scoring.score)

    @app.post("/rerank")
    @app.post("/v1/rerank")
    @app.post("/v2/rerank")
    async def rerank(req: scoring.RerankRequest) -> dict[str, Any]:
        """Jina's and Cohere's rerank, as vLLM serves it: the documents by relevance."""
        return await pooled(req, "/rerank", scoring.rerank)

    @app.post("/tokenize")
    async def tokenize(req: TokenizeRequest) -> dict[str, Any]:
        await front.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise bad_request("give exactly one of prompt and messages", "prompt")
        prompt: PromptType = req.prompt if req.prompt is not None else convert.chat_prompt(
            req.messages or [], req.add_generation_prompt, req.tools, req.chat_template_kwargs,
            req.continue_final_message)
        return await front.client().tokenize(prompt, req.add_special_tokens,
                                             req.return_token_strs)

    @app.post("/detokenize")
    async def detokenize(req: DetokenizeRequest) -> dict[str, Any]:
        await front.check_model(req.model)
        return {"prompt": await front.client().detokenize(req.tokens)}

    return app


def _warn_ignored(req: BaseModel, path: str, taken: set[str] | None = None) -> None:
    """vLLM's warning for fields it does not know: the request is served without them."""
    ignored = sorted(set(req.model_extra or {}) - (taken or set()))
    if ignored:
        log.warning("%s: the request's fields %s are not known and were ignored", path,
                    ignored)


async def _serve(front: Front, req: _Sampling, shaper: Shaper, prompts: list[PromptType],
                 params: SamplingParams, lora: LoRARequest | None, request: Request,
                 reshape: ResponsesShape | None = None) -> Response:
    span = start_request_span(request, "chat" if shaper.chat else "text_completion",
                              shaper.model)
    try:
        response = await _respond(front, req, shaper, prompts, params, lora, request, span,
                                  reshape)
    except BaseException as exc:
        end_request_span(span, from_exception(exc).status if isinstance(exc, Exception) else 499,
                         exc)
        raise
    if not isinstance(response, StreamingResponse):  # a stream ends its span when it ends
        end_request_span(span, response.status_code)
    return response


async def _respond(front: Front, req: _Sampling, shaper: Shaper, prompts: list[PromptType],
                   params: SamplingParams, lora: LoRARequest | None, request: Request,
                   span: Span, reshape: ResponsesShape | None = None) -> Response:
    timeout_s = client_timeout_s(request.headers, bool(req.stream))
    jobs = [Job(f"{shaper.id}-{i}", p, params, lora, req.priority, timeout_s)
            for i, p in enumerate(prompts)]
    stream = OutputStream(front.client(), jobs, span)
    if not req.stream:
        work = asyncio.ensure_future(final_outputs(stream, len(jobs)))
        if not await _finished_before_disconnect(work, request):
            return Response(status_code=CLIENT_CLOSED_REQUEST)  # nobody reads it
        body = shaper.response(work.result())
        return JSONResponse(body if reshape is None else reshape.body(body))
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    shaper.continuous_usage = bool(include_usage and req.stream_options
                                   and req.stream_options.continuous_usage_stats)
    first: tuple[int, RequestOutput] | None
    try:
        # The first output before the response starts: bad input is still a 400, not a stream.
        first = await stream.__anext__()
    except StopAsyncIteration:
        first = None
    except BaseException:
        stream.close()
        raise
    form: StreamForm = reshape if reshape is not None else ChatEvents(shaper, include_usage)
    return StreamingResponse(_events(stream, first, span, form),
                             media_type="text/event-stream")


# nginx's code for "the client closed the request": logged, never seen by the client.
CLIENT_CLOSED_REQUEST = 499


async def _finished_before_disconnect(work: asyncio.Future[Any], request: Request) -> bool:
    """Wait for work unless the HTTP client goes away first; then cancel it (final_outputs then
    closes its stream, which aborts the engine requests) and return False. A non-streaming
    handler is not cancelled by the server when its client leaves, so this watches for it."""
    watch = asyncio.ensure_future(_until_disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if work.done():
        return True
    work.cancel()
    try:
        await work
    except (asyncio.CancelledError, Exception):  # noqa: BLE001 - its client is gone
        pass
    return False


async def _until_disconnected(request: Request) -> None:
    # The body is already read, so the next message the server has for this request is its
    # disconnect: an event, not a poll.
    while (await request.receive())["type"] != "http.disconnect":
        pass


class StreamForm(Protocol):
    """What a stream's events are made of: ChatEvents (chat, completions) or ResponsesShape."""

    def start(self) -> list[str]: ...
    def output(self, job: int, out: RequestOutput) -> list[str]: ...
    def end(self) -> list[str]: ...
    def error(self, exc: Exception) -> str: ...
    def after(self) -> list[str]: ...


async def _events(stream: OutputStream, first: tuple[int, RequestOutput] | None,
                  span: Span, form: StreamForm) -> AsyncIterator[str]:
    error: BaseException | None = None
    try:
        for event in form.start():
            yield event
        if first is not None:
            for event in form.output(*first):
                yield event
        async for index, output in stream:
            for event in form.output(index, output):
                yield event
        for event in form.end():
            yield event
    except Exception as exc:  # noqa: BLE001 - the status is sent: report it in the stream
        error = exc
        yield form.error(exc)
    except BaseException as exc:  # the client left: this generator was cancelled
        error = exc
        raise
    finally:
        stream.close()  # the client left (cancelled here) or the stream ended: abort the rest
        end_request_span(span, 200, error)
    for event in form.after():
        yield event
