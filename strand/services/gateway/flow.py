"""GatewayFlow: the front door of the ring (gateway -> tokenizer -> engine -> detokenizer ->
gateway). It owns what a front door needs and nothing of the engine's orchestration:

- which requests are live (its own: outputs come back on its subscription, by its origin id),
  and which client each belongs to (strand/services/gateway/clients.py: ids namespaced per client);
- AddRequest: one message to the tokenizer, answered once the request is in the engine;
- Step (manual mode): one message to the engine with a step id; the step's outputs reach the
  gateway through the detokenizer tagged with that id. Every output waits in its client's
  bounded Outbox, and a Step returns the caller's, a page at a time. In auto mode the engine
  steps itself and Step returns what arrived since the last Step (every case of who steps
  when: strand/engine_core/step_driver.py);
- Abort: one message to the detokenizer, which drops the request and has the engine drop it;
- the Generate streams, and cancellation.
A lost detokenizer ends every live request with finish_reason "error" here; a lost engine does so
in the detokenizer, whose "error" outputs arrive like any other.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import grpc
from opentelemetry import trace

from strand.engine_core.sampling_params import RequestOutputKind
from strand.engine_core.step_driver import SELF_STEP_AFTER_S
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import tokenizer_pb2 as tpb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.engine_replicas import EngineReplicas
from strand.services.common.stage_auth import stage_metadata
from strand.services.common.stage_client import StageClient
from strand.services.common.status import DRAINING_MESSAGE, StageError, StageUnavailable
from strand.services.common.tracing import carrier_from_context
from strand.services.gateway.abort_batches import AbortBatches
from strand.services.gateway.background_aborts import BackgroundAborts
from strand.services.gateway.clients import (
    DEFAULT_MAX_PENDING_BYTES,
    DEFAULT_MAX_PENDING_OUTPUTS,
    DEFAULT_STEP_PAGE_BYTES,
    check_request_id,
    internal_id,
    output_bytes,
)
from strand.services.gateway.control import GatewayControl
from strand.services.gateway.live import (
    LiveRequest,
    abort_output,
    error_output,
    finish_reason_of,
)
from strand.services.gateway.metrics import GatewayMetrics
from strand.services.gateway.outboxes import Outboxes
from strand.services.gateway.output_feed import OutputFeed
from strand.services.gateway.reconcile import LOST_REASON, RECONCILE_S, Reconciler
from strand.services.gateway.request_span import fail_request_span, start_request_span
from strand.services.gateway.self_step import SelfStepper
from strand.services.gateway.step_runner import StepRunner
from strand.services.gateway.stream_outputs import StreamOutputs

logger = logging.getLogger(__name__)

# How long an AddRequest waits for this gateway's output subscription (a restarted detokenizer
# is subscribed again within a fraction of it).
SUBSCRIBE_WAIT_S = 1.0


class GatewayFlow:
    def __init__(self, tokenizer: StageClient, engine: StageClient | EngineReplicas,
                 detokenizer: StageClient,
                 self_step_after: float = SELF_STEP_AFTER_S,
                 max_step_page_bytes: int = DEFAULT_STEP_PAGE_BYTES,  # --max-message-bytes
                 max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                 max_pending_outputs: int = DEFAULT_MAX_PENDING_OUTPUTS,
                 reconcile_every: float = RECONCILE_S) -> None:
        # Per client, its outputs owed to its next Step (results of its own and others' steps,
        # auto mode's, self-steps', "error" endings).
        self.outboxes = Outboxes(max_step_page_bytes, max_pending_bytes, max_pending_outputs)
        self.tokenizer = tokenizer
        # One engine or data-parallel replicas: Step and engine-wide calls reach each one.
        self.engines = engine if isinstance(engine, EngineReplicas) else EngineReplicas([engine])
        self.detokenizer = detokenizer
        # Outputs of the requests this gateway adds come back to it by this id.
        self.origin = f"gw-{uuid.uuid4().hex[:16]}"
        self.feed = OutputFeed(detokenizer, self.origin, self._on_batch, self._detokenizer_lost)
        self.auto_step: bool | None = None  # the engine's mode, learned from its GetInfo
        self.model: str | None = None  # the engine's model, learned with its mode (spans)
        self.metrics: GatewayMetrics | None = None  # set by the gateway's main
        self._live: dict[str, LiveRequest] = {}  # by internal id
        self.draining = False  # stopping (drain.py): new requests are refused
        self._aborting: dict[str, str] = {}  # internal id -> client, while its abort runs
        self.steps = StepRunner(self.engines, self.origin, self._added_ids, self._end_lost)
        self._step_lock = asyncio.Lock()  # manual mode: one step at a time, as LLMEngine
        self.control = GatewayControl(self.engines, self._step_lock)
        # Every abort to the detokenizer, batched: one message in flight (abort_batches.py).
        self.abort_batches = AbortBatches(detokenizer)
        self.aborts = BackgroundAborts(self.abort_batches)
        self.self_stepper = SelfStepper(self_step_after, self._has_streams, self._is_auto,
                                        self._step_lock, self.steps.step_once,
                                        lambda: self.steps.engine_idle)
        self._self_step_task: asyncio.Task[None] | None = None
        self.reconciler = Reconciler(self.engines, lambda: list(self._live.values()),
                                     self._end_lost, reconcile_every)
        self._reconcile_task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.feed.start()
        loop = asyncio.get_running_loop()
        if self._self_step_task is None:
            self._self_step_task = loop.create_task(self.self_stepper.run())
            self._reconcile_task = loop.create_task(self.reconciler.run())

    async def close(self) -> None:
        for task in (self._self_step_task, self._reconcile_task):
            if task is not None:
                task.cancel()
        await self.feed.close()
        await self.control.close()
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
                # wait_for_ready: the ring's streams may run over the local link, so this
                # channel can still be in its reconnect back-off after the engine came back;
                # without it the call would fail at once though the engine answers.
                return await self.engines.clients[name].stub.GetInfo(
                    epb.EngineInfoRequest(), timeout=10 if name in up else 2,
                    metadata=stage_metadata(), wait_for_ready=True)
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

    async def add_request(self, client: str, public_id: str, prompt: pb.Prompt,
                          params: pb.SamplingParams, arrival_time: float | None = None,
                          priority: int = 0, queue: StreamOutputs | None = None,
                          lora_request: pb.LoRARequest | None = None,
                          pooling: pb.PoolingParams | None = None,
                          deadline: float | None = None) -> str:
        """Add the client's request; its internal id (the stages' name for it). pooling: an
        embedding request's params (params is then unused). deadline: time.time() past which
        the caller no longer waits (the engine then drops it itself)."""
        request_id = internal_id(client, public_id)
        try:
            check_request_id(public_id)
            if self.draining:
                raise StageError(grpc.StatusCode.UNAVAILABLE, DRAINING_MESSAGE)
            if request_id in self._live:  # only the caller's own ids can collide
                raise StageError(grpc.StatusCode.ALREADY_EXISTS,
                                 f"request_id {public_id!r} is already in use")
            if queue is None:  # a Generate stream's outputs never wait for a Step
                self.outboxes.check_add(client)
        except StageError as exc:
            if self.metrics is not None:
                self.metrics.refused(exc)
            raise
        await self.feed.wait_subscribed(SUBSCRIBE_WAIT_S)
        # The id its client knows; the stages' spans name the internal one.
        span = start_request_span(public_id, prompt, params, self.model)
        span.set_attribute("strand.request.internal_id", request_id)
        kind = params.output_kind
        # Live before the tokenizer answers: in auto mode the first outputs may come first.
        live = LiveRequest(request_id=request_id, child_ids=[], span=span,
                           cumulative=kind == RequestOutputKind.CUMULATIVE,
                           final_only=kind == RequestOutputKind.FINAL_ONLY,
                           num_prompt_tokens=0, queue=queue,
                           num_outputs=params.n if params.HasField("n") else 1,
                           metrics=self.metrics, client=client, public_id=public_id)
        self._live[request_id] = live
        try:
            added = await self._add(request_id, prompt, params, arrival_time, priority, span,
                                    lora_request, pooling, deadline)
        except BaseException as exc:
            if self._live.get(request_id) is live:
                del self._live[request_id]
            if isinstance(exc, asyncio.CancelledError):
                # Unfinished for its client until the abort that _add left behind has run.
                self._aborting[request_id] = client
            fail_request_span(span, exc)
            if self.metrics is not None:
                self.metrics.refused(exc)
            raise
        finally:
            self.self_stepper.work.set()
        if self.metrics is not None:
            self.metrics.added()
        live.child_ids = list(added.child_ids)
        live.num_outputs = len(added.child_ids)
        live.num_prompt_tokens = int(added.num_prompt_tokens)
        if live.aborted:
            # Aborted while the stages were taking it: drop it from them now that it is in.
            self.aborts.abort(request_id)
        if queue is not None:
            self.self_stepper.clock.note_stream_added()
        return request_id

    async def _add(self, request_id: str, prompt: pb.Prompt, params: pb.SamplingParams,
                   arrival_time: float | None, priority: int, span: trace.Span,
                   lora_request: pb.LoRARequest | None = None,
                   pooling: pb.PoolingParams | None = None,
                   deadline: float | None = None) -> tpb.AddedRequest:
        process = tpb.ProcessRequest(request_id=request_id, prompt=prompt, params=params,
                                     priority=priority, origin=self.origin,
                                     lora_request=lora_request, pooling_params=pooling)
        if arrival_time is not None:
            process.arrival_time = arrival_time
        if deadline is not None:
            process.deadline = deadline
        # Written in this turn where the link lets it (StageClient.send), answered in the task.
        call = self.tokenizer.send(tpb.TokenizerRequest(
            process=process, trace_context=carrier_from_context(trace.set_span_in_context(span))))
        try:
            resp = await asyncio.shield(call)
        except asyncio.CancelledError:
            # The caller gave up (a deadline, a cancelled call) while the stages were taking
            # the request: once they have, it must not run on unseen, holding KV blocks. The
            # tokenizer is told at once: it refuses the add if it has not sent it on yet, else
            # aborts it in the engine right behind the add (not a round trip later).
            early = self.tokenizer.send(tpb.TokenizerRequest(
                abort=tpb.TokenizerAbort(request_ids=[request_id])))
            early.add_done_callback(_ignore_result)
            self.aborts.abort_when_added(call, request_id,
                                          lambda rid: self._aborting.pop(rid, None))
            raise
        return resp.added  # type: ignore[no-any-return]

    async def tokenizer_lookup(self, msg: tpb.TokenizerRequest) -> tpb.TokenizerResponse:
        """A Tokenize or Detokenize message, answered by the tokenizer stage alone."""
        msg.trace_context.update(carrier_from_context())  # the caller's RPC span
        return await self.tokenizer.call(msg)  # type: ignore[no-any-return]

    async def step(self, client: str, max_response_bytes: int | None = None
                   ) -> tuple[list[pb.RequestOutput], list[str], int]:
        """(the caller's outputs, a page of them; ids of its Generate requests whose output went
        to their streams; how many of its outputs still wait for its next Step)."""
        page = self.outboxes.page_bytes(max_response_bytes)
        box = self.outboxes.get(client)
        streamed: list[tuple[str, str]] = []
        # A backlog larger than one answer is paged out first: stepping on would only grow it.
        if not await self._is_auto() and box.fits(page):
            self.self_stepper.clock.note_step_call()
            async with self._step_lock:
                try:
                    # Nothing to compute (as EngineCore.step): report what is owed.
                    if self._live:
                        streamed = await self.steps.step_once()
                except StageError:
                    if not box:  # a lost stage's "error" endings: this step's news
                        raise
                finally:
                    self.self_stepper.clock.note_step_call()
        mine = [rid for c, rid in streamed if c == client]
        return self._take_page(client, page, mine), mine, len(box)

    def _take_page(self, client: str, page: int, streamed: list[str]
                   ) -> list[pb.RequestOutput]:
        outputs, oversized = self.outboxes.take_page(client, page, streamed)
        for output in oversized:
            # It can never be sent as it is: its request ends in an explicit "error" instead,
            # which the next Step returns.
            reason = (f"an output of {output_bytes(output)} bytes exceeds the Step response "
                      f"limit of {page} bytes (StepRequest.max_response_bytes, the gateway's "
                      f"--max-message-bytes); the request was aborted")
            self._end_with_error(client, output.request_id, reason)
        if not any(live.client == client for live in self._live.values()):
            self.outboxes.forget_if_empty(client)
        return outputs

    def _end_with_error(self, client: str, public_id: str, reason: str) -> None:
        """End the client's request now with an "error" output (replacing what it still had
        waiting), and drop it from the stages."""
        box = self.outboxes.get(client)
        box.discard(public_id)
        rid = internal_id(client, public_id)
        live = self._live.pop(rid, None)
        num_outputs = live.num_outputs if live is not None else 1
        if live is not None:
            live.end_span(None, "error")
            self.aborts.abort(rid)
        box.put(error_output(public_id, num_outputs, reason))

    def _end_lost(self, request_ids: list[str]) -> None:
        """End requests the engine lost with "error"; the detokenizer forgets them too."""
        lost = [rid for rid in request_ids if rid in self._live]
        self._deliver([error_output(rid, self._live[rid].num_outputs, LOST_REASON)
                       for rid in lost])
        for rid in lost:
            self.aborts.abort(rid)

    def _on_batch(self, batch: Any) -> None:
        self.steps.on_outputs(batch.step_id, self._deliver(list(batch.outputs)))

    def _deliver(self, outputs: list[pb.RequestOutput]) -> list[tuple[str, str]]:
        """Each output to its stream or its client's Outbox (under the client's own id);
        the (client, id) of the streamed ones."""
        streamed: list[tuple[str, str]] = []
        boxed: set[str] = set()
        for output in outputs:
            live = self._live.get(output.request_id)
            if live is None:
                continue  # aborted here meanwhile: LLMEngine reports nothing more for it
            live.record(output)
            if output.finished:
                del self._live[output.request_id]
                live.end_span(output, finish_reason_of(output))
            output.request_id = live.public_id
            if live.queue is not None:
                live.queue.put(output)
                streamed.append((live.client, live.public_id))
            else:
                self.outboxes.get(live.client).put(output)
                boxed.add(live.client)
        for client in boxed:
            if self.outboxes.is_over(client):
                self._overflow(client)
        return streamed

    def _overflow(self, client: str) -> None:
        """The client's Outbox passed its bound: its Step-fed requests end with "error" (their
        outputs so far stay owed to it); nothing more accrues until it calls Step."""
        box = self.outboxes.get(client)
        reason = f"{self.outboxes.over_reason(client)}: call Step more often"
        ended = [live for live in self._live.values()
                 if live.client == client and live.queue is None]
        logger.warning("client %s: %s; aborting its %d running requests", client, reason,
                       len(ended))
        for live in ended:
            del self._live[live.request_id]
            live.end_span(None, "error")
            self.aborts.abort(live.request_id)
            box.put(error_output(live.public_id, live.num_outputs, reason))

    async def abort(self, client: str, public_ids: list[str]) -> None:
        """Abort the client's requests; NOT_FOUND names the ids that are none of its running
        requests (finished, never added, or another client's: the same answer for each)."""
        rids = [internal_id(client, rid) for rid in public_ids]
        unknown = [pid for pid, rid in zip(public_ids, rids, strict=True) if rid not in self._live]
        await self.abort_internal([rid for rid in rids if rid in self._live])
        if unknown:
            shown = ", ".join(repr(pid[:40]) for pid in unknown[:5])
            more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
            raise StageError(grpc.StatusCode.NOT_FOUND,
                             f"no running request of this client has id {shown}{more}")

    async def abort_internal(self, request_ids: list[str]) -> None:
        if not request_ids:
            return
        ended = [live for rid in request_ids if (live := self._live.pop(rid, None)) is not None]
        for live in ended:
            live.aborted = True
            # Still unfinished for its client until the stages have dropped it.
            self._aborting[live.request_id] = live.client
        try:
            # The detokenizer drops them and has the engine drop them before it answers; aborts
            # that come meanwhile go in one message after it (abort_batches.py).
            await self.abort_batches.abort(request_ids)
        finally:
            for live in ended:
                self._aborting.pop(live.request_id, None)
                live.end_span(None, "abort")
                if live.queue is not None:
                    # vLLM's streams end with a final output whose finish_reason is "abort".
                    live.queue.put(abort_output(live.public_id, live.num_outputs))

    async def get_num_unfinished_requests(self, client: str) -> int:
        # The caller's requests that have not ended. The detokenizer would say the same for
        # them (a request leaves both with its final output), but asking it costs a round trip
        # on every iteration of a `while has_unfinished_requests(): step()` loop.
        return (sum(1 for live in self._live.values() if live.client == client)
                + sum(1 for owner in self._aborting.values() if owner == client))

    @property
    def num_live(self) -> int:
        """Every client's unfinished requests."""
        return len(self._live)

    def live_requests(self) -> list[LiveRequest]:
        return list(self._live.values())

    def _added_ids(self) -> list[str]:
        """Live requests whose adds the stages have answered (the engine surely holds them)."""
        return [rid for rid, live in self._live.items() if live.child_ids]

    def _has_streams(self) -> bool:
        return any(live.queue is not None for live in self._live.values())

    # -- lost stages ----------------------------------------------------------------------------

    def _detokenizer_lost(self, reason: str) -> None:
        """Every live request ends with "error" (the engine drops them itself on losing its
        subscriber); Step calls waiting for outputs fail."""
        self._deliver([error_output(rid, live.num_outputs, reason)
                       for rid, live in self._live.items()])
        self.steps.fail_all(reason)


def _ignore_result(task: asyncio.Task[Any]) -> None:
    """A best-effort call's outcome, retrieved (a failure is covered by the call after it)."""
    if not task.cancelled():
        task.exception()
