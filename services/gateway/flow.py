"""GatewayFlow: the life of a request across the three stages (no engine logic of its own).

1. AddRequest: tokenizer (InputProcessor.process) -> detokenizer (OutputProcessor.add_request
   returns the child requests) -> engine (EngineCore.add_request for each child).
2. Step: engine step -> detokenizer process_outputs -> RequestOutputs (+ stop-string aborts back to
   the engine). Outputs of Generate requests go to their streams, the rest to the Step caller.
   Steps come from Step calls (manual mode), from the gateway itself (auto mode), or, in manual
   mode, from the gateway for Generate streams once no Step call has come for a while.
3. Abort: detokenizer abort_requests (returns child ids) -> engine abort.
A lost engine or detokenizer ends every live request with finish_reason "error".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Coroutine
from typing import Any

import grpc
from opentelemetry import trace

from engine_core.sampling_params import RequestOutputKind
from services._proto.strand.v1 import detokenizer_pb2 as dpb
from services._proto.strand.v1 import engine_pb2 as epb
from services._proto.strand.v1 import tokenizer_pb2 as tpb
from services._proto.strand.v1 import types_pb2 as pb
from services.common.status import StageError, StageUnavailable
from services.common.tracing import carrier_from_context, tracer
from services.gateway.live import LiveRequest, StreamQueue, error_output, finish_reason_of
from services.gateway.stage_client import StageClient

logger = logging.getLogger(__name__)

# Auto mode: engine steps queued ahead of the detokenizer (one computing, one waiting). A stop
# string then stops its request up to this many steps late; the detokenizer drops those tokens.
STEPS_IN_FLIGHT = 2
# Auto mode: engine steps per call while nobody streams (every live request wants its final
# output only). Each stage then handles a quarter of the messages, and on a small machine their
# CPU time is what the engine's steps lack (benchmarks/README.md). No token arrives later than
# its request's end; a request added meanwhile waits for the calls already queued (up to
# STEPS_IN_FLIGHT * this many steps) before it joins.
STEPS_PER_CALL_UNSTREAMED = 4
# Manual mode: a Generate stream steps the engine itself (as auto mode would) once no Step call
# has come for this long, counted from the stream's start too. A client that drives Generate
# with Step calls (EngineClient.generate) keeps control; one that only reads the stream
# (grpcurl) is not left waiting forever.
SELF_STEP_AFTER_S = 1.0


class GatewayFlow:
    def __init__(self, tokenizer: StageClient, engine: StageClient, detokenizer: StageClient,
                 auto_step: bool = False, self_step_after: float = SELF_STEP_AFTER_S) -> None:
        if not self_step_after > 0:
            raise ValueError(f"self_step_after must be > 0 seconds, got {self_step_after}")
        self.tokenizer = tokenizer
        self.engine = engine
        self.detokenizer = detokenizer
        self.auto_step = auto_step
        engine.on_lost = self._engine_lost
        detokenizer.on_lost = self._detokenizer_lost
        # One engine-changing sequence at a time: the stages are sequential anyway, and an abort
        # must not slip between a request's detokenizer add and its engine add.
        self._lock = asyncio.Lock()
        self._live: dict[str, LiveRequest] = {}
        # Outputs owed to the next Step: auto-mode results and "error" endings.
        self._pending: list[pb.RequestOutput] = []
        self._work = asyncio.Event()
        self._auto_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._num_adding = 0  # add_request calls past the tokenizer, not yet in the engine
        self.self_step_after = self_step_after
        self._self_step_task: asyncio.Task[None] | None = None
        # Manual mode: when a Step call or a Generate stream last came (time.monotonic()).
        self._last_step_call = -math.inf
        self._last_stream_added = -math.inf

    def start(self) -> None:
        if self.auto_step and self._auto_task is None:
            self._auto_task = asyncio.get_running_loop().create_task(self._auto_loop())
        if not self.auto_step and self._self_step_task is None:
            self._self_step_task = asyncio.get_running_loop().create_task(self._self_step_loop())

    async def close(self) -> None:
        for task in (self._auto_task, self._self_step_task):
            if task is not None:
                task.cancel()
        for client in (self.tokenizer, self.engine, self.detokenizer):
            await client.close()

    # -- requests -------------------------------------------------------------------------------

    async def add_request(self, request_id: str, prompt: pb.Prompt, params: pb.SamplingParams,
                          arrival_time: float | None = None, priority: int = 0,
                          queue: StreamQueue | None = None) -> None:
        if not request_id:
            raise StageError(grpc.StatusCode.INVALID_ARGUMENT, "request_id must not be empty")
        if request_id in self._live:
            raise StageError(grpc.StatusCode.ALREADY_EXISTS,
                             f"request_id {request_id!r} is already in use")
        span = tracer().start_span("llm_request", attributes={"gen_ai.request.id": request_id})
        _set_param_attributes(span, params)
        # Counted until the request is in: the auto loop queues no new step meanwhile, so an
        # add waits for the step being computed, not for every step queued behind it.
        self._num_adding += 1
        try:
            await self._add(request_id, prompt, params, arrival_time, priority, queue, span)
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(trace.Status(trace.StatusCode.ERROR, str(exc)))
            span.end()
            raise
        finally:
            self._num_adding -= 1
            self._work.set()

    async def _add(self, request_id: str, prompt: pb.Prompt, params: pb.SamplingParams,
                   arrival_time: float | None, priority: int, queue: StreamQueue | None,
                   span: trace.Span) -> None:
        carrier = carrier_from_context(trace.set_span_in_context(span))
        process = tpb.ProcessRequest(request_id=request_id, prompt=prompt, params=params,
                                     priority=priority)
        if arrival_time is not None:
            process.arrival_time = arrival_time
        tok = await self.tokenizer.call(tpb.TokenizerRequest(process=process,
                                                             trace_context=carrier))
        processed = tok.processed
        async with self._lock:
            try:
                detok = await self.detokenizer.call(dpb.DetokenizerRequest(
                    add=dpb.DetokAddRequest(processed=processed), trace_context=carrier))
                children = list(detok.children.requests)
                try:
                    await self.engine.call(epb.EngineRequest(
                        add=epb.EngineAddRequests(requests=children), trace_context=carrier))
                except StageError:
                    # All or nothing: the detokenizer forgets the request the engine refused.
                    await self._quietly(self.detokenizer, dpb.DetokenizerRequest(
                        abort=dpb.DetokAbort(request_ids=[request_id])))
                    raise
            except asyncio.CancelledError:
                # The caller gave up (a deadline, a cancelled call) while a stage was taking the
                # request: what the stages took must not run on unseen, holding KV blocks. The
                # abort queues behind the add on each ordered stream, once the lock is free.
                self._spawn(self._abort_quietly(request_id))
                raise
            kind = processed.request.sampling_params.output_kind
            self._live[request_id] = LiveRequest(
                request_id=request_id, child_ids=[c.request_id for c in children], span=span,
                cumulative=kind == RequestOutputKind.CUMULATIVE,
                final_only=kind == RequestOutputKind.FINAL_ONLY,
                num_prompt_tokens=len(processed.request.prompt_token_ids), queue=queue)
            if queue is not None:
                self._last_stream_added = time.monotonic()

    async def step(self) -> tuple[list[pb.RequestOutput], list[str]]:
        """(outputs for the caller, ids of Generate requests whose output went to their stream)."""
        if self.auto_step:
            owed, self._pending = self._pending, []
            return owed, []
        self._last_step_call = time.monotonic()
        async with self._lock:
            if not self._live:
                # Nothing to compute (as EngineCore.step): report endings owed by a lost stage.
                owed, self._pending = self._pending, []
                return owed, []
            try:
                outputs = await self._step_once()
            finally:
                self._last_step_call = time.monotonic()
        owed, self._pending = self._pending, []
        returned, streamed = self._deliver(outputs)
        return owed + returned, streamed

    async def _step_once(self) -> list[pb.RequestOutput]:
        return await self._detokenize(await self._engine_step(), wait_for_aborts=True)

    async def _engine_step(self, num_steps: int = 1) -> epb.EngineResponse:
        return await self.engine.call(epb.EngineRequest(
            step=epb.EngineStep(num_steps=num_steps), trace_context=carrier_from_context()))

    def _steps_per_call(self) -> int:
        if self._live and all(live.final_only for live in self._live.values()):
            return STEPS_PER_CALL_UNSTREAMED
        return 1

    async def _detokenize(self, resp: epb.EngineResponse, wait_for_aborts: bool
                          ) -> list[pb.RequestOutput]:
        result = (await self.detokenizer.call(dpb.DetokenizerRequest(
            process_outputs=dpb.DetokProcessOutputs(outputs=resp.outputs),
            trace_context=carrier_from_context()))).result
        if result.reqs_to_abort:
            # Stop strings end requests in the detokenizer; the engine must stop computing them.
            abort = self.engine.call(epb.EngineRequest(
                abort=epb.EngineAbort(request_ids=list(result.reqs_to_abort))))
            if wait_for_aborts:
                await abort
            else:
                # The engine stream is ordered: the abort lands before any step sent after it,
                # so its answer need not hold up the next step.
                self._spawn(self._quietly_awaited(self.engine.stage, abort))
        return list(result.request_outputs)

    def _deliver(self, outputs: list[pb.RequestOutput]) -> tuple[list[pb.RequestOutput], list[str]]:
        returned: list[pb.RequestOutput] = []
        streamed: list[str] = []
        for output in outputs:
            live = self._live.get(output.request_id)
            if live is not None:
                live.record(output)
                if output.finished:
                    del self._live[output.request_id]
                    live.end_span(output, finish_reason_of(output))
            if live is not None and live.queue is not None:
                live.queue.put_nowait(output)
                streamed.append(output.request_id)
            else:
                returned.append(output)
        return returned, streamed

    async def abort(self, request_ids: list[str]) -> None:
        async with self._lock:
            child_ids = (await self.detokenizer.call(dpb.DetokenizerRequest(
                abort=dpb.DetokAbort(request_ids=request_ids),
                trace_context=carrier_from_context()))).child_ids.request_ids
            await self.engine.call(epb.EngineRequest(
                abort=epb.EngineAbort(request_ids=list(child_ids)),
                trace_context=carrier_from_context()))
            for request_id in request_ids:
                live = self._live.pop(request_id, None)
                if live is not None:
                    live.end_span(None, "abort")
                    if live.queue is not None:
                        live.queue.put_nowait(None)

    async def reset_prefix_cache(self, reset_running_requests: bool, reset_connector: bool
                                 ) -> bool:
        async with self._lock:
            resp = await self.engine.call(epb.EngineRequest(
                reset_prefix_cache=epb.EngineResetPrefixCache(
                    reset_running_requests=reset_running_requests,
                    reset_connector=reset_connector),
                trace_context=carrier_from_context()))
        return bool(resp.state.reset_ok)

    async def clear_kv_cache(self, instance_id: str, location: str) -> tuple[str, int]:
        """EngineCore.clear_kv_cache: (event id, number of tokens cleared)."""
        async with self._lock:
            resp = await self.engine.call(epb.EngineRequest(
                clear_kv_cache=epb.EngineClearKvCache(instance_id=instance_id,
                                                      location=location),
                trace_context=carrier_from_context()))
        return resp.cleared.event_id, int(resp.cleared.num_tokens_cleared)

    async def lookup_kv_cache(self, token_ids: list[int]) -> dict[str, int]:
        """EngineCore.lookup_kv_cache: per location, how many leading tokens are cached."""
        resp = await self.engine.call(epb.EngineRequest(
            lookup_kv_cache=epb.EngineLookupKvCache(token_ids=token_ids),
            trace_context=carrier_from_context()))
        return {k: int(v) for k, v in resp.lookup.num_cached_tokens.items()}

    async def get_num_unfinished_requests(self) -> int:
        # The requests this gateway added that have not ended. The detokenizer would say the
        # same for them (a request leaves both with its final output), but asking it costs a
        # round trip on every iteration of a `while has_unfinished_requests(): step()` loop.
        return len(self._live)

    # -- auto mode ------------------------------------------------------------------------------

    async def _auto_loop(self) -> None:
        # Engine steps stay queued ahead of the detokenizer, so the engine computes step N+1
        # while step N is detokenized and delivered: nothing waits on a round trip.
        in_flight: deque[asyncio.Task[epb.EngineResponse]] = deque()
        try:
            await self._run_auto_steps(in_flight)
        finally:
            for task in in_flight:
                task.cancel()

    async def _run_auto_steps(self, in_flight: deque[asyncio.Task[epb.EngineResponse]]) -> None:
        while True:
            try:
                self._top_up(in_flight)
                if not in_flight:
                    self._work.clear()
                    await self._work.wait()
                    continue
                resp = await in_flight.popleft()
                self._top_up(in_flight)
                outputs = await self._detokenize(resp, wait_for_aborts=False)
                returned, _ = self._deliver(outputs)
                self._pending.extend(returned)
                if not resp.outputs.outputs:
                    await asyncio.sleep(0.001)  # a step with nothing to report: do not spin
            except StageError as exc:
                logger.warning("auto step failed: %s", exc.message)
                await _drain(in_flight)
                await asyncio.sleep(0.2)
            await asyncio.sleep(0)  # let waiting RPCs run between steps

    def _top_up(self, in_flight: deque[asyncio.Task[epb.EngineResponse]]) -> None:
        # No new step while requests are being added: many requests arriving together all join
        # the next step (as in a loop that adds them all, then steps) instead of one per step.
        # Only a sustained stream of adds (hundreds a second) could hold stepping back.
        while self._live and not self._num_adding and len(in_flight) < STEPS_IN_FLIGHT:
            in_flight.append(asyncio.get_running_loop().create_task(
                self._engine_step(self._steps_per_call())))

    # -- manual mode: Generate streams nobody steps ---------------------------------------------

    async def _self_step_loop(self) -> None:
        while True:
            try:
                if not self._has_streams():
                    self._work.clear()
                    await self._work.wait()
                    continue
                wait = self._self_step_wait()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                async with self._lock:
                    # Re-checked under the lock: a Step call may have run meanwhile.
                    if not self._has_streams() or self._self_step_wait() > 0:
                        continue
                    outputs = await self._step_once()
                # Outputs of AddRequest requests this step advanced wait for the next Step.
                returned, _ = self._deliver(outputs)
                self._pending.extend(returned)
                if not outputs:
                    await asyncio.sleep(0.001)  # a step with nothing to report: do not spin
            except StageError as exc:
                logger.warning("self-step for Generate streams failed: %s", exc.message)
                await asyncio.sleep(0.2)
            await asyncio.sleep(0)  # let waiting RPCs run between steps

    def _has_streams(self) -> bool:
        return any(live.queue is not None for live in self._live.values())

    def _self_step_wait(self) -> float:
        """Seconds until Generate streams may step themselves (<= 0: now)."""
        quiet_since = max(self._last_step_call, self._last_stream_added)
        return quiet_since + self.self_step_after - time.monotonic()

    # -- lost stages ----------------------------------------------------------------------------

    async def _engine_lost(self, error: StageUnavailable) -> None:
        async with self._lock:
            ids = list(self._live)
            if not ids:
                return
            try:
                resp = await self.detokenizer.call(dpb.DetokenizerRequest(
                    finish_with_error=dpb.DetokFinishWithError(request_ids=ids,
                                                               reason=error.message)))
                outputs = list(resp.result.request_outputs)
            except StageError:
                outputs = []
            self._end_with_error(outputs, error.message)

    async def _detokenizer_lost(self, error: StageUnavailable) -> None:
        async with self._lock:
            ids = list(self._live)
            if not ids:
                return
            child_ids = [c for i in ids for c in self._live[i].child_ids]
            await self._quietly(self.engine, epb.EngineRequest(
                abort=epb.EngineAbort(request_ids=child_ids)))
            self._end_with_error([], error.message)

    def _end_with_error(self, outputs: list[pb.RequestOutput], reason: str) -> None:
        """Deliver the "error" endings; live requests the stage could not end get our own."""
        covered = {o.request_id for o in outputs if o.finished}
        for request_id, live in list(self._live.items()):
            if request_id not in covered:
                outputs.append(error_output(request_id, len(live.child_ids), reason))
        returned, _ = self._deliver(outputs)
        self._pending.extend(returned)

    async def _abort_quietly(self, request_id: str) -> None:
        try:
            await self.abort([request_id])
        except StageError as exc:
            logger.warning("abort of %s after a cancelled add failed: %s", request_id,
                           exc.message)

    @staticmethod
    async def _quietly(client: StageClient, msg: object) -> None:
        await GatewayFlow._quietly_awaited(client.stage, client.call(msg))

    @staticmethod
    async def _quietly_awaited(stage: str, call: Awaitable[object]) -> None:
        try:
            await call
        except StageError as exc:
            logger.warning("%s cleanup failed: %s", stage, exc.message)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._background.discard)


async def _drain(tasks: deque[asyncio.Task[epb.EngineResponse]]) -> None:
    """Await (and forget) steps still in flight after a failure: their stage is gone."""
    while tasks:
        with contextlib.suppress(StageError, asyncio.CancelledError):
            await tasks.popleft()


def _set_param_attributes(span: trace.Span, params: pb.SamplingParams) -> None:
    for name in ("n", "temperature", "top_p", "max_tokens"):
        if params.HasField(name):
            span.set_attribute(f"gen_ai.request.{name}", getattr(params, name))
