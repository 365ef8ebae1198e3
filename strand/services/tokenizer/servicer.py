"""Tokenizer servicer: the ring's first stage. Each ProcessRequest from a gateway is tokenized
(InputProcessor.process, off the event loop), routed to an engine replica (ReplicaRouter: the
first place its token ids are known), and handed, as its state, to the detokenizer and, as its
children (n > 1 fans out into n), to that engine; the gateway's answer says the request is in
the engine, or why it is not (with the stages left as they were).

Requests are handled concurrently and answered as they finish (matched by seq): one long prompt
does not hold up the short ones behind it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from strand.engine_core.core.engine_io import EngineCoreRequest
from strand.engine_core.pooling.params import PoolingParams
from strand.engine_core.processing.input_processor import InputProcessor, ProcessedPrompt
from strand.engine_core.processing.parallel_sampling import fan_out
from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import detokenizer_pb2 as dpb
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import tokenizer_pb2 as tpb
from strand.services._proto.strand.v1 import tokenizer_pb2_grpc
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.convert import (
    core_request_to_pb,
    optional_lora_from_pb,
    params_from_pb,
    pooling_params_from_pb,
    prompt_from_pb,
)
from strand.services.common.convert_core import processed_to_pb
from strand.services.common.engine_replicas import EngineReplicas
from strand.services.common.stage_client import StageClient
from strand.services.common.status import StageError, error_to_pb, status_of
from strand.services.common.tracing import context_from_carrier, server_span
from strand.services.tokenizer.engine_modes import EngineModes
from strand.services.tokenizer.entering import Entering, EnteringRequests
from strand.services.tokenizer.metrics import TokenizerMetrics
from strand.services.tokenizer.routing import ReplicaRouter

logger = logging.getLogger(__name__)

# Prompts up to these sizes are processed on the event loop. Handing one to the tokenize thread
# and back costs two thread wake-ups (0.2-0.5 ms on a busy 2-core machine: most of the
# tokenizer's share of a short request's time to first token), more than validating a few
# thousand ids or tokenizing a thousand characters; longer prompts and chat templates still go
# to the thread, so that one long prompt does not stall the other streams.
INLINE_MAX_TOKEN_IDS = 4096
INLINE_MAX_TEXT_CHARS = 1024


def processes_inline(prompt: pb.Prompt) -> bool:
    """Whether the prompt is small enough to process on the loop (see INLINE_MAX_*)."""
    kind = prompt.WhichOneof("kind")
    if kind == "token_ids":
        return len(prompt.token_ids.ids) <= INLINE_MAX_TOKEN_IDS
    if kind == "text":
        return len(prompt.text) <= INLINE_MAX_TEXT_CHARS
    return False


class TokenizerServicer(tokenizer_pb2_grpc.TokenizerServicer):
    def __init__(self, processor: InputProcessor, detokenizer: StageClient,
                 engines: EngineReplicas, router: ReplicaRouter,
                 metrics: TokenizerMetrics | None = None) -> None:
        self.processor = processor
        self.metrics = metrics
        self.detokenizer = detokenizer
        self.engines = engines
        self.router = router
        self.modes = EngineModes(engines)
        # One thread: tokenizing a long prompt must not stall the loop (health, other streams).
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize")
        self._tasks: set[asyncio.Task[None]] = set()
        self.entering = EnteringRequests()  # adds not yet answered, for early aborts

    async def close(self) -> None:
        await self.router.close()
        await self.detokenizer.close()
        await self.engines.close()
        self._executor.shutdown(wait=False)

    async def Session(self, request_iterator: AsyncIterator[tpb.TokenizerRequest],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[tpb.TokenizerResponse]:
        answers: asyncio.Queue[tpb.TokenizerResponse | None] = asyncio.Queue()
        reader = asyncio.get_running_loop().create_task(self._read(request_iterator, answers))
        try:
            while True:
                answer = await answers.get()
                if answer is None:
                    return
                yield answer
        finally:
            reader.cancel()

    async def _read(self, request_iterator: AsyncIterator[tpb.TokenizerRequest],
                    answers: asyncio.Queue[tpb.TokenizerResponse | None]) -> None:
        """Every message as soon as it is read: an abort is applied at once, an add is entered
        (so that an abort finds it) and waits its turn to start, one a turn of the loop.

        Started as read, a burst of adds ran one after the other (each tokenized and sent on
        in its first turn) before the reader's next turn, and an abort read behind them found
        its add already in the engine: hundreds of adds later, a cancelled request was taken
        in and aborted there only after a step. Started one a turn, the reader (and the
        link's socket) has its turn between any two adds: an abort overtakes the adds still
        waiting, and its own is refused when its turn comes, neither tokenized nor sent on."""
        loop = asyncio.get_running_loop()
        pending: set[asyncio.Task[None]] = set()
        waiting: deque[tuple[tpb.TokenizerRequest, Entering]] = deque()  # adds not begun
        more = asyncio.Event()

        def start(msg: tpb.TokenizerRequest, entry: Entering | None = None) -> None:
            # Not cancelled with the stream: a request half-way into the stages finishes
            # its way in (its gateway's departure then aborts it).
            task = loop.create_task(self._answer_into(msg, answers, entry))
            pending.add(task)
            self._tasks.add(task)
            task.add_done_callback(pending.discard)
            task.add_done_callback(self._tasks.discard)

        async def start_adds() -> None:
            while True:
                await more.wait()
                while waiting:
                    start(*waiting.popleft())
                    await asyncio.sleep(0)  # the reader's turn: aborts read meanwhile apply
                more.clear()

        starter = loop.create_task(start_adds())
        try:
            try:
                async for msg in request_iterator:
                    kind = msg.WhichOneof("kind")
                    if kind == "abort":
                        answers.put_nowait(self._abort_answer(msg))
                    elif kind == "process":
                        waiting.append((msg, self.entering.begin(msg.process.request_id)))
                        more.set()
                    else:
                        start(msg)
            finally:
                starter.cancel()
                while waiting:  # the stream ended: what was read still goes in (or is refused)
                    start(*waiting.popleft())
            if pending:
                await asyncio.wait(pending)
        finally:
            answers.put_nowait(None)

    async def _answer_into(self, msg: tpb.TokenizerRequest,
                           answers: asyncio.Queue[tpb.TokenizerResponse | None],
                           entry: Entering | None = None) -> None:
        answers.put_nowait(await self.answer(msg, entry))

    async def answer(self, msg: tpb.TokenizerRequest, entry: Entering | None = None
                     ) -> tpb.TokenizerResponse:
        """The answer to one message; entry: the add's, entered when it was read (None: entered
        here)."""
        kind = msg.WhichOneof("kind")
        if kind in ("tokenize", "detokenize"):
            return await self._lookup(msg, kind)
        if kind == "abort":
            return self._abort_answer(msg)
        req = msg.process
        parent = context_from_carrier(msg.trace_context)
        with server_span("strand.v1.Tokenizer/Process", parent,
                         {"gen_ai.request.id": req.request_id}) as span:
            try:
                added = await self._add(req, dict(msg.trace_context), entry)
            except Exception as exc:  # answered in-stream: the session stays open
                span.set_attribute("error.message", str(exc))
                span.set_attribute("error.type", status_of(exc)[0].name)
                if self.metrics is not None:
                    self.metrics.refused(exc)
                return tpb.TokenizerResponse(seq=msg.seq, error=error_to_pb(exc))
            if self.metrics is not None:
                self.metrics.added()
            span.set_attribute("gen_ai.usage.prompt_tokens", added.num_prompt_tokens)
            return tpb.TokenizerResponse(seq=msg.seq, added=added)

    async def _lookup(self, msg: tpb.TokenizerRequest, kind: str) -> tpb.TokenizerResponse:
        """Tokenize / Detokenize: the processor's answer, nothing sent on (long prompts on the
        tokenize thread, as adds)."""
        with server_span(f"strand.v1.Tokenizer/{kind.capitalize()}",
                         context_from_carrier(msg.trace_context)):
            try:
                if kind == "tokenize":
                    inline = processes_inline(msg.tokenize.prompt)
                    tokenized = await self._off_loop(inline, self._tokenize, msg.tokenize)
                    return tpb.TokenizerResponse(seq=msg.seq, tokenized=tokenized)
                inline = len(msg.detokenize.tokens) <= INLINE_MAX_TOKEN_IDS
                text = await self._off_loop(inline, self.processor.detokenize,
                                            msg.detokenize.tokens)
                return tpb.TokenizerResponse(seq=msg.seq,
                                             detokenized=pb.DetokenizeResponse(prompt=text))
            except Exception as exc:  # answered in-stream: the session stays open
                return tpb.TokenizerResponse(seq=msg.seq, error=error_to_pb(exc))

    async def _off_loop(self, inline: bool, fn: Any, *args: Any) -> Any:
        """fn(*args) on the loop when inline (a small prompt), else on the tokenize thread."""
        if inline:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _tokenize(self, req: pb.TokenizeRequest) -> pb.TokenizeResponse:
        add_special = req.add_special_tokens if req.HasField("add_special_tokens") else None
        ids = self.processor.tokenize(prompt_from_pb(req.prompt), add_special)
        strs = self.processor.token_strs(ids) if req.return_token_strs else []
        return pb.TokenizeResponse(tokens=ids, count=len(ids),
                                   max_model_len=self.processor.max_model_len, token_strs=strs)

    async def _add(self, req: tpb.ProcessRequest, carrier: dict[str, str],
                   entry: Entering | None = None) -> tpb.AddedRequest:
        if entry is None:
            entry = self.entering.begin(req.request_id)
        try:
            _refuse_if_aborted(entry)  # aborted while it waited its turn: nothing done yet
            return await self._add_entering(req, carrier, entry)
        finally:
            self.entering.end(req.request_id, entry)

    async def _add_entering(self, req: tpb.ProcessRequest, carrier: dict[str, str],
                            entry: Entering) -> tpb.AddedRequest:
        params: SamplingParams | PoolingParams | None = (
            pooling_params_from_pb(req.pooling_params) if req.HasField("pooling_params")
            else params_from_pb(req.params) if req.HasField("params") else None)
        arrival = req.arrival_time if req.HasField("arrival_time") else None
        args = (req.request_id, prompt_from_pb(req.prompt), params, arrival, req.priority, None,
                optional_lora_from_pb(req))
        processed = await self._off_loop(processes_inline(req.prompt), self._process, *args)
        request = processed.request
        if req.HasField("deadline"):
            request.deadline = req.deadline  # its children inherit it (fan_out)
        lora = request.lora_request
        engine = self.router.route(request.prompt_token_ids, request.cache_salt,
                                   None if lora is None else lora.lora_int_id)
        try:
            children = await self._add_on(engine, req, processed, carrier, entry)
        finally:
            self.router.answered(engine)
        return tpb.AddedRequest(child_ids=[c.request_id for c in children],
                                num_prompt_tokens=len(request.prompt_token_ids),
                                output_kind=int(request.sampling_params.output_kind))

    async def _add_on(self, engine: str, req: tpb.ProcessRequest, processed: ProcessedPrompt,
                      carrier: dict[str, str], entry: Entering | None = None
                      ) -> list[EngineCoreRequest]:
        """The request's state to the detokenizer and its children to the chosen engine, all or
        nothing: at once to an auto-stepping engine (the detokenizer keeps outputs that beat the
        state, early_outputs.py), in turn to a manually stepped one (engine_modes.py)."""
        children = fan_out(processed.request)
        detok_add = dpb.DetokenizerRequest(
            add=dpb.DetokAddRequest(processed=processed_to_pb(processed), origin=req.origin,
                                    engine=engine),
            trace_context=carrier)
        engine_add = epb.EngineRequest(
            add=epb.EngineAddRequests(requests=[core_request_to_pb(c) for c in children]),
            trace_context=carrier)
        auto = await self.modes.auto_step(engine)
        # Checked after asking the mode, which may wait (GetInfo: every add of the first burst
        # after a start, or after the replica came back into rotation): an abort that came
        # meanwhile found no add sent and only marked the request. Nothing awaits from here
        # to the sends, so an abort either is seen here or follows the add (entry.engine).
        _refuse_if_aborted(entry)
        if not auto:
            await self.detokenizer.call(detok_add)
            try:
                _refuse_if_aborted(entry)  # the detokenizer's answer took a round trip too
                await self.engines.call(engine, engine_add)
            except BaseException:
                await self._forget_in_detokenizer(req.request_id)
                raise
            return children
        # The engine's add first: it is on the way to the first token (the detokenizer keeps
        # outputs that beat the state). Both are written in this turn where the links let them
        # (StageClient.send), not in their tasks' first turns after it.
        sends = (self.engines.send(engine, engine_add), self.detokenizer.send(detok_add))
        if entry is not None:  # an abort from now on follows the add on the engine's stream
            entry.engine, entry.child_ids = engine, [c.request_id for c in children]
        results: tuple[Any, Any] = await asyncio.gather(*sends, return_exceptions=True)
        added, detok = results
        for result in (detok, added):
            if isinstance(result, BaseException) and not isinstance(result, Exception):
                raise result  # cancelled: only at shutdown (adds outlive their streams)
        if isinstance(detok, Exception):
            if not isinstance(added, Exception):
                await self._abort_in_engine(engine, [c.request_id for c in children])
            raise detok
        if isinstance(added, Exception):
            await self._forget_in_detokenizer(req.request_id)
            raise added
        return children

    def _abort_answer(self, msg: tpb.TokenizerRequest) -> tpb.TokenizerResponse:
        self._abort(list(msg.abort.request_ids))
        return tpb.TokenizerResponse(seq=msg.seq, added=tpb.AddedRequest())

    def _abort(self, request_ids: list[str]) -> None:
        """The gateway gave up on these while they were on their way in: those not yet sent on
        are refused when they would be; those in the engine are aborted right behind their add
        (the engine's Session runs its messages in order)."""
        for engine, child_ids in self.entering.abort(request_ids).items():
            task = asyncio.get_running_loop().create_task(
                self._abort_in_engine(engine, child_ids))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _process(self, *args: Any) -> ProcessedPrompt:
        start = time.perf_counter()
        try:
            return self.processor.process(*args)
        finally:
            if self.metrics is not None:
                self.metrics.tokenize_time.observe(time.perf_counter() - start)

    async def _abort_in_engine(self, engine: str, child_ids: list[str]) -> None:
        try:
            await self.engines.call(engine, epb.EngineRequest(
                abort=epb.EngineAbort(request_ids=child_ids)))
        except StageError as exc:
            logger.warning("engine cleanup of %s failed: %s", child_ids, exc.message)

    async def _forget_in_detokenizer(self, request_id: str) -> None:
        try:
            await self.detokenizer.call(dpb.DetokenizerRequest(
                abort=dpb.DetokAbort(request_ids=[request_id], never_admitted=True)))
        except StageError as exc:
            logger.warning("detokenizer cleanup of %s failed: %s", request_id, exc.message)


def _refuse_if_aborted(entry: Entering | None) -> None:
    """CANCELLED when the gateway gave up on the request before its add was sent on; called in
    the same turn of the loop as the send (an abort marks the entry only: with no engine set,
    nothing else would act on it)."""
    if entry is not None and entry.aborted:
        raise StageError(grpc.StatusCode.CANCELLED, "the request was aborted on its way in")
