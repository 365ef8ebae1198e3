"""GatewayFlow: the front door of the ring (gateway -> tokenizer -> engine -> detokenizer ->
gateway). It owns what a front door needs and nothing of the engine's orchestration:

- which requests are live (its own: outputs come back on its subscription, by its origin id);
- AddRequest: one message to the tokenizer, answered once the request is in the engine;
- Step (manual mode): one message to the engine with a step id; the step's outputs reach the
  gateway through the detokenizer tagged with that id, and Step returns exactly them. In auto
  mode the engine steps itself and Step returns what arrived since the last Step;
- Abort: one message to the detokenizer, which drops the request and has the engine drop it;
- the Generate streams, and cancellation.
A lost detokenizer ends every live request with finish_reason "error" here; a lost engine does so
in the detokenizer, whose "error" outputs arrive like any other.

With engine replicas (EngineReplicas), engine-wide calls fan out to every replica in rotation:
Step steps each (one step id per replica) and returns the union of their outputs; reset, clear
and lookup report per replica beside the aggregate; loads list the replicas.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import grpc
from opentelemetry import trace

from engine_core.sampling_params import RequestOutputKind
from services._proto.strand.v1 import detokenizer_pb2 as dpb
from services._proto.strand.v1 import engine_pb2 as epb
from services._proto.strand.v1 import gateway_pb2 as gpb
from services._proto.strand.v1 import tokenizer_pb2 as tpb
from services._proto.strand.v1 import types_pb2 as pb
from services.common.engine_replicas import EngineReplicas
from services.common.stage_auth import stage_metadata
from services.common.stage_client import StageClient
from services.common.status import StageError, StageUnavailable
from services.common.tracing import carrier_from_context
from services.gateway.kv_event_feed import KvEventFeed
from services.gateway.live import (
    LiveRequest,
    StreamQueue,
    abort_output,
    error_output,
    finish_reason_of,
)
from services.gateway.metrics import GatewayMetrics
from services.gateway.output_feed import OutputFeed
from services.gateway.replica_reports import answers, cleared_report, lookup_report, reset_report
from services.gateway.request_span import fail_request_span, start_request_span

logger = logging.getLogger(__name__)

# Manual mode: a Generate stream steps the engine itself (as auto mode would) once no Step call
# has come for this long, counted from the stream's start too. A client that drives Generate
# with Step calls (EngineClient.generate) keeps control; one that only reads the stream
# (grpcurl) is not left waiting forever.
SELF_STEP_AFTER_S = 1.0
# A Step's outputs cross the detokenizer after the engine has run it; past this they are lost
# (the detokenizer died with them) and the Step fails as UNAVAILABLE.
STEP_OUTPUTS_TIMEOUT_S = 10.0
# How long an AddRequest waits for this gateway's output subscription (a restarted detokenizer
# is subscribed again within a fraction of it).
SUBSCRIBE_WAIT_S = 1.0
MAX_REQUEST_ID_CHARS = 256


class GatewayFlow:
    def __init__(self, tokenizer: StageClient, engine: StageClient | EngineReplicas,
                 detokenizer: StageClient, self_step_after: float = SELF_STEP_AFTER_S) -> None:
        if not self_step_after > 0:
            raise ValueError(f"self_step_after must be > 0 seconds, got {self_step_after}")
        self.tokenizer = tokenizer
        self.engines = engine if isinstance(engine, EngineReplicas) else EngineReplicas([engine])
        self.detokenizer = detokenizer
        # Outputs of the requests this gateway adds come back to it by this id.
        self.origin = f"gw-{uuid.uuid4().hex[:16]}"
        self.feed = OutputFeed(detokenizer, self.origin, self._on_batch, self._detokenizer_lost)
        self.kv_feed = KvEventFeed(self.engines)
        self.auto_step: bool | None = None  # the engine's mode, learned from its GetInfo
        self.model: str | None = None  # the engine's model, learned with its mode (spans)
        self.metrics: GatewayMetrics | None = None  # set by the gateway's main
        self._live: dict[str, LiveRequest] = {}
        # Outputs owed to the next Step: auto-mode results, self-steps' and "error" endings.
        self._pending: list[pb.RequestOutput] = []
        self._step_ids = itertools.count(1)
        self._step_waiters: dict[int, asyncio.Future[tuple[list[pb.RequestOutput],
                                                           list[str]]]] = {}
        self._step_replica: dict[int, str] = {}  # step id -> the replica it stepped
        # A replica that leaves the rotation mid-step took its step's outputs with it (its
        # requests end with "error" through the detokenizer): that step has nothing to wait for.
        self.engines.listeners.append(self._replica_left)
        self._step_lock = asyncio.Lock()  # manual mode: one step at a time, as LLMEngine
        self._work = asyncio.Event()
        self._background: set[asyncio.Task[Any]] = set()
        self.self_step_after = self_step_after
        self._self_step_task: asyncio.Task[None] | None = None
        # Manual mode: when a Step call or a Generate stream last came (time.monotonic()).
        self._last_step_call = -math.inf
        self._last_stream_added = -math.inf

    def start(self) -> None:
        self.feed.start()
        if self._self_step_task is None:
            self._self_step_task = asyncio.get_running_loop().create_task(self._self_step_loop())

    async def close(self) -> None:
        if self._self_step_task is not None:
            self._self_step_task.cancel()
        await self.feed.close()
        await self.kv_feed.close()
        for client in (self.tokenizer, self.detokenizer):
            await client.close()
        await self.engines.close()

    async def engine_info(self) -> epb.EngineInfo:
        """The first replica in rotation's answer (they share the model and the mode)."""
        infos = await self.engine_infos()
        for info in infos.values():
            if not isinstance(info, StageError):
                self.auto_step = bool(info.auto_step)
                self.model = info.model
                return info
        raise next(iter(infos.values()))

    async def engine_infos(self) -> dict[str, epb.EngineInfo | StageError]:
        """Every replica's GetInfo (rotation order first), or why it did not answer."""
        async def one(name: str) -> epb.EngineInfo | StageError:
            try:
                # Short for a replica known to be down: a host that vanished does not refuse.
                return await self.engines.clients[name].stub.GetInfo(
                    epb.EngineInfoRequest(), timeout=10 if name in up else 2,
                    metadata=stage_metadata())
            except grpc.aio.AioRpcError as exc:
                return StageUnavailable("engine", exc.details() or exc.code().name)
        up = self.engines.in_rotation()
        names = up + [n for n in self.engines.names if n not in up]
        return dict(zip(names, await asyncio.gather(*(one(n) for n in names)), strict=True))

    async def _is_auto(self) -> bool:
        if self.auto_step is None:
            await self.engine_info()
        return bool(self.auto_step)

    # -- requests -------------------------------------------------------------------------------

    async def add_request(self, request_id: str, prompt: pb.Prompt, params: pb.SamplingParams,
                          arrival_time: float | None = None, priority: int = 0,
                          queue: StreamQueue | None = None,
                          lora_request: pb.LoRARequest | None = None) -> None:
        try:
            check_request_id(request_id)
            if request_id in self._live:
                raise StageError(grpc.StatusCode.ALREADY_EXISTS,
                                 f"request_id {request_id!r} is already in use")
        except StageError as exc:
            if self.metrics is not None:
                self.metrics.refused(exc)
            raise
        await self.feed.wait_subscribed(SUBSCRIBE_WAIT_S)
        span = start_request_span(request_id, prompt, params, self.model)
        kind = params.output_kind
        # Live before the tokenizer answers: in auto mode the first outputs may come first.
        live = LiveRequest(request_id=request_id, child_ids=[], span=span,
                           cumulative=kind == RequestOutputKind.CUMULATIVE,
                           final_only=kind == RequestOutputKind.FINAL_ONLY,
                           num_prompt_tokens=0, queue=queue,
                           num_outputs=params.n if params.HasField("n") else 1,
                           metrics=self.metrics)
        self._live[request_id] = live
        try:
            added = await self._add(request_id, prompt, params, arrival_time, priority, span,
                                    lora_request)
        except BaseException as exc:
            if self._live.get(request_id) is live:
                del self._live[request_id]
            fail_request_span(span, exc)
            if self.metrics is not None:
                self.metrics.refused(exc)
            raise
        finally:
            self._work.set()
        if self.metrics is not None:
            self.metrics.added()
        live.child_ids = list(added.child_ids)
        live.num_outputs = len(added.child_ids)
        live.num_prompt_tokens = int(added.num_prompt_tokens)
        if live.aborted:
            # Aborted while the stages were taking it: drop it from them now that it is in.
            self._spawn(self._abort_quietly(request_id))
        if queue is not None:
            self._last_stream_added = time.monotonic()

    async def _add(self, request_id: str, prompt: pb.Prompt, params: pb.SamplingParams,
                   arrival_time: float | None, priority: int, span: trace.Span,
                   lora_request: pb.LoRARequest | None = None) -> tpb.AddedRequest:
        process = tpb.ProcessRequest(request_id=request_id, prompt=prompt, params=params,
                                     priority=priority, origin=self.origin,
                                     lora_request=lora_request)
        if arrival_time is not None:
            process.arrival_time = arrival_time
        call = asyncio.get_running_loop().create_task(self.tokenizer.call(tpb.TokenizerRequest(
            process=process, trace_context=carrier_from_context(trace.set_span_in_context(span)))))
        try:
            resp = await asyncio.shield(call)
        except asyncio.CancelledError:
            # The caller gave up (a deadline, a cancelled call) while the stages were taking
            # the request: once they have, it must not run on unseen, holding KV blocks.
            self._spawn(self._abort_when_added(call, request_id))
            raise
        return resp.added  # type: ignore[no-any-return]

    async def step(self) -> tuple[list[pb.RequestOutput], list[str]]:
        """(outputs for the caller, ids of Generate requests whose output went to their stream)."""
        if await self._is_auto():
            return self._take_pending(), []
        self._last_step_call = time.monotonic()
        async with self._step_lock:
            if not self._live:
                # Nothing to compute (as EngineCore.step): report endings owed by a lost stage.
                return self._take_pending(), []
            try:
                returned, streamed = await self._step_once()
            except StageError:
                if self._pending:  # a lost stage's "error" endings: they are this step's news
                    return self._take_pending(), []
                raise
            finally:
                self._last_step_call = time.monotonic()
        return self._take_pending() + returned, streamed

    async def _step_once(self) -> tuple[list[pb.RequestOutput], list[str]]:
        """One step of every replica in rotation (each with its own step id); the union of
        their outputs. A replica that fails is out of rotation: its requests end with "error"
        through the detokenizer, and the others' step stands."""
        names = self.engines.in_rotation() or self.engines.names  # none: try all (fan_out)
        step_ids = {name: next(self._step_ids) for name in names}
        loop = asyncio.get_running_loop()
        waiters = {step_id: loop.create_future() for step_id in step_ids.values()}
        self._step_waiters.update(waiters)
        self._step_replica.update({step_id: name for name, step_id in step_ids.items()})
        carrier = carrier_from_context()
        try:
            results = answers(await self.engines.fan_out(lambda name: epb.EngineRequest(
                step=epb.EngineStep(step_id=step_ids[name], origin=self.origin),
                trace_context=carrier), names))
            stepped = [step_ids[n] for n, r in results.items() if not isinstance(r, StageError)]
            done, _ = await asyncio.wait([waiters[i] for i in stepped],
                                         timeout=STEP_OUTPUTS_TIMEOUT_S)
            returned: list[pb.RequestOutput] = []
            streamed: list[str] = []
            for step_id in stepped:
                waiter = waiters[step_id]
                if waiter not in done:
                    raise StageUnavailable("detokenizer", f"the outputs of step {step_id} did "
                                           f"not arrive within {STEP_OUTPUTS_TIMEOUT_S:.0f}s")
                outputs, ids = waiter.result()
                returned += outputs
                streamed += ids
            return returned, streamed
        finally:
            for step_id in waiters:
                self._step_waiters.pop(step_id, None)
                self._step_replica.pop(step_id, None)

    def _replica_left(self, replica: str, in_rotation: bool) -> None:
        if in_rotation:
            return
        for step_id, name in self._step_replica.items():
            waiter = self._step_waiters.get(step_id)
            if name == replica and waiter is not None and not waiter.done():
                waiter.set_result(([], []))

    def _take_pending(self) -> list[pb.RequestOutput]:
        owed, self._pending = self._pending, []
        return owed

    def _on_batch(self, batch: Any) -> None:
        returned, streamed = self._deliver(list(batch.outputs))
        waiter = self._step_waiters.get(batch.step_id) if batch.step_id else None
        if waiter is not None and not waiter.done():
            waiter.set_result((returned, streamed))
        else:
            self._pending.extend(returned)

    def _deliver(self, outputs: list[pb.RequestOutput]) -> tuple[list[pb.RequestOutput], list[str]]:
        returned: list[pb.RequestOutput] = []
        streamed: list[str] = []
        for output in outputs:
            live = self._live.get(output.request_id)
            if live is None:
                continue  # aborted here meanwhile: LLMEngine reports nothing more for it
            live.record(output)
            if output.finished:
                del self._live[output.request_id]
                live.end_span(output, finish_reason_of(output))
            if live.queue is not None:
                live.queue.put_nowait(output)
                streamed.append(output.request_id)
            else:
                returned.append(output)
        return returned, streamed

    async def abort(self, request_ids: list[str]) -> None:
        ended = [live for rid in request_ids if (live := self._live.pop(rid, None)) is not None]
        for live in ended:
            live.aborted = True
        try:
            # The detokenizer drops them and has the engine drop them before it answers.
            await self.detokenizer.call(dpb.DetokenizerRequest(
                abort=dpb.DetokAbort(request_ids=request_ids),
                trace_context=carrier_from_context()))
        finally:
            for live in ended:
                live.end_span(None, "abort")
                if live.queue is not None:
                    # vLLM's streams end with a final output whose finish_reason is "abort".
                    live.queue.put_nowait(abort_output(live.request_id, live.num_outputs))

    @property
    def num_live(self) -> int:
        return len(self._live)

    async def get_num_unfinished_requests(self) -> int:
        # The requests this gateway added that have not ended. The detokenizer would say the
        # same for them (a request leaves both with its final output), but asking it costs a
        # round trip on every iteration of a `while has_unfinished_requests(): step()` loop.
        return len(self._live)

    # -- engine-wide control --------------------------------------------------------------------

    async def reset_prefix_cache(self, reset_running_requests: bool, reset_connector: bool
                                 ) -> gpb.ResetPrefixCacheResponse:
        carrier = carrier_from_context()
        async with self._step_lock:  # between steps, as in process
            results = await self.engines.fan_out(lambda _: epb.EngineRequest(
                reset_prefix_cache=epb.EngineResetPrefixCache(
                    reset_running_requests=reset_running_requests,
                    reset_connector=reset_connector),
                trace_context=carrier))
        return reset_report(results)

    async def lora(self, call: epb.EngineLoraCall) -> epb.EngineLoraResult:
        """EngineCore.add_lora / remove_lora / list_loras / pin_lora on every replica, between
        steps (a request may be routed to any of them): success where every replica succeeded,
        and the adapters loaded on all of them."""
        carrier = carrier_from_context()
        async with self._step_lock:
            results = await self.engines.fan_out(
                lambda _: epb.EngineRequest(lora=call, trace_context=carrier))
        for result in results.values():
            if isinstance(result, StageError):
                raise result
        answers = [r.lora for r in results.values()]
        loaded = set(answers[0].lora_ids).intersection(*(a.lora_ids for a in answers[1:]))
        return epb.EngineLoraResult(success=all(a.success for a in answers),
                                    lora_ids=sorted(loaded))

    async def engine_call(self, **kind: Any) -> epb.EngineState:
        """One engine-wide call (sleep, wake_up, profile, query) between steps, on every
        replica: engine-wide means all of them, so any replica's failure is the call's. The
        first replica's state, with is_sleeping true when any replica sleeps and every
        replica's profile trace path."""
        carrier = carrier_from_context()
        async with self._step_lock:
            results = await self.engines.fan_out(
                lambda _: epb.EngineRequest(**kind, trace_context=carrier))
        for result in results.values():
            if isinstance(result, StageError):
                raise result
        states = [r.state for r in results.values()]
        state = epb.EngineState()
        state.CopyFrom(states[0])
        state.is_sleeping = any(s.is_sleeping for s in states)
        state.profile_path = ",".join(s.profile_path for s in states if s.profile_path)
        return state

    async def clear_kv_cache(self, instance_id: str, location: str) -> gpb.ClearKvCacheResponse:
        """EngineCore.clear_kv_cache on every replica ("" or the core's own id), or on the one
        whose address instance_id is."""
        names = [instance_id] if instance_id in self.engines.clients else None
        instance_id = "" if names else instance_id
        carrier = carrier_from_context()
        async with self._step_lock:
            results = await self.engines.fan_out(lambda _: epb.EngineRequest(
                clear_kv_cache=epb.EngineClearKvCache(instance_id=instance_id,
                                                      location=location),
                trace_context=carrier), names)
        return cleared_report(results)

    async def lookup_kv_cache(self, token_ids: list[int]) -> gpb.LookupKvCacheResponse:
        """EngineCore.lookup_kv_cache per replica: per location, leading tokens cached."""
        carrier = carrier_from_context()
        results = await self.engines.fan_out(lambda _: epb.EngineRequest(
            lookup_kv_cache=epb.EngineLookupKvCache(token_ids=token_ids),
            trace_context=carrier))
        return lookup_report(results)

    async def get_loads(self) -> list[pb.EngineLoad]:
        """Every replica in rotation's load, named by its address as the router knows it."""
        results = answers(await self.engines.fan_out(
            lambda _: epb.EngineRequest(get_loads=epb.EngineGetLoads())))
        loads = []
        for name, result in results.items():
            if not isinstance(result, StageError):
                result.load.engine = name
                loads.append(result.load)
        return loads

    async def kv_events(self) -> AsyncIterator[pb.KvEventBatch]:
        """The engine's KV event batches as they come (polled: the engine keeps them in a
        bounded buffer with consecutive sequence numbers, so a gap shows what was dropped)."""
        async for batch in self.kv_feed.subscribe():
            yield batch

    # -- manual mode: Generate streams nobody steps ---------------------------------------------

    async def _self_step_loop(self) -> None:
        while True:
            try:
                if not self._has_streams() or await self._is_auto():
                    self._work.clear()
                    await self._work.wait()
                    continue
                wait = self._self_step_wait()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                async with self._step_lock:
                    # Re-checked under the lock: a Step call may have run meanwhile.
                    if not self._has_streams() or self._self_step_wait() > 0:
                        continue
                    returned, _ = await self._step_once()
                # Outputs of AddRequest requests this step advanced wait for the next Step.
                self._pending.extend(returned)
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

    def _detokenizer_lost(self, reason: str) -> None:
        """Every live request ends with "error" (the engine drops them itself on losing its
        subscriber); Step calls waiting for outputs fail."""
        outputs = [error_output(rid, live.num_outputs, reason)
                   for rid, live in self._live.items()]
        self._pending.extend(self._deliver(outputs)[0])
        for waiter in self._step_waiters.values():
            if not waiter.done():
                waiter.set_exception(StageError(grpc.StatusCode.UNAVAILABLE, reason))

    async def _abort_when_added(self, call: asyncio.Task[Any], request_id: str) -> None:
        try:
            await call
        except StageError:
            return  # it never got in
        self._live.pop(request_id, None)
        await self._abort_quietly(request_id)

    async def _abort_quietly(self, request_id: str) -> None:
        try:
            await self.detokenizer.call(dpb.DetokenizerRequest(
                abort=dpb.DetokAbort(request_ids=[request_id])))
        except StageError as exc:
            logger.warning("abort of %s failed: %s", request_id, exc.message)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)  # held until done: the loop keeps only weak references
        task.add_done_callback(self._background.discard)


def check_request_id(request_id: str) -> None:
    """Ids travel as gRPC metadata (strand-request-id) and in logs: printable ASCII only, and
    bounded; checked before anything is added anywhere."""
    if not request_id:
        raise StageError(grpc.StatusCode.INVALID_ARGUMENT, "request_id must not be empty")
    shown = repr(request_id[:40]) + ("..." if len(request_id) > 40 else "")
    if len(request_id) > MAX_REQUEST_ID_CHARS:
        raise StageError(grpc.StatusCode.INVALID_ARGUMENT,
                         f"request_id must be at most {MAX_REQUEST_ID_CHARS} characters, got "
                         f"{len(request_id)} ({shown})")
    if not all(" " <= c <= "~" for c in request_id):
        raise StageError(grpc.StatusCode.INVALID_ARGUMENT,
                         f"request_id must be printable ASCII (0x20-0x7E), got {shown}")
