"""Engine servicer: the ring's middle. Requests come in on Sessions (the tokenizer adds, the
detokenizer aborts what stop strings ended, the gateway steps and controls); each step's outputs
go out on the detokenizer's Outputs subscription, tagged with the Step call that ran it.

Every core call runs on one thread, the core's. libgomp keeps a team of OpenMP workers per
thread that starts parallel work, and once it manages more threads than there are CPUs it stops
spin-waiting between parallel regions: a model loaded on the main thread and stepped on another
left a second, idle team behind, and every GEMM of every step then put its workers to sleep and
woke them again (tens of thousands of context switches per benchmark run, 12% slower on 2 cores).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import torch
from opentelemetry import context as otel_context

from strand.engine_core.config import EngineArgs
from strand.engine_core.core.engine import EngineCore
from strand.engine_core.core.engine_io import EngineCoreOutputs
from strand.engine_core.model_executor.cpu_allocator import tune_cpu_allocator
from strand.engine_core.model_executor.model_config import dtype_name
from strand.engine_core.stats_logger import StatsLogger
from strand.engine_core.step_driver import (
    ADD_QUIET_S,
    BACK_TO_BACK_MIN_S,
    AddBursts,
    BackToBack,
)
from strand.platform.cpu_binding import binding_mode
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import engine_pb2_grpc
from strand.services.common.convert import core_outputs_to_pb
from strand.services.common.status import StageError, error_to_pb, status_of
from strand.services.common.tracing import carrier_from_context, context_from_carrier, server_span
from strand.services.engine.core_calls import CoreCalls
from strand.services.engine.core_thread import CoreThread
from strand.services.engine.kv_events_hub import KvEventsHub
from strand.services.engine.outputs_hub import OutputsHub
from strand.services.engine.spare_core import SpareCore, fills_cpus

# Session messages whose core calls are queued but not yet answered (one stage's stream).
MAX_IN_FLIGHT = 256


def core_executor() -> ThreadPoolExecutor:
    # One thread: the core is not thread-safe, and the loop must stay free for health checks.
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-core")


class EngineServicer(engine_pb2_grpc.EngineServicer):
    def __init__(self, core: EngineCore, model_name: str,
                 executor: ThreadPoolExecutor | None = None,
                 stats_logger: StatsLogger | None = None, auto_step: bool = False,
                 name: str = "engine", add_quiet_s: float = ADD_QUIET_S,
                 back_to_back_min_s: float = BACK_TO_BACK_MIN_S,
                 num_threads: int | None = None, spare_core: bool | None = None) -> None:
        """num_threads: torch's on the core's thread (default: this thread's). spare_core:
        spare_core.py; None: where the steps fill the CPUs."""
        self.core = core
        self.model_name = model_name
        self.auto_step = auto_step
        self.back_to_back = BackToBack(back_to_back_min_s)
        self.calls = CoreCalls(core, stats_logger, name)
        self.kv_hub = KvEventsHub(core, name)
        self.calls.after_call = self.kv_hub.drain
        # The thread that built the core (see the module docstring), or a new one.
        self._executor = executor or core_executor()
        self.thread = CoreThread(self._executor)
        self._hub: OutputsHub | None = None
        self._closed = False
        self._has_work = False  # auto mode: the core has unfinished requests
        self._wakes = 0  # adds seen, so a step can tell whether one came while it ran
        self._work: asyncio.Event | None = None
        self._bursts = AddBursts(add_quiet_s)  # auto mode: a burst of adds joins one step
        # Auto mode: step messages the core's thread posted / the hub took (each written by one
        # side), and the puts on their way.
        self._posted = 0
        self._delivered = 0
        self._deliveries: deque[asyncio.Task[None]] = deque()
        threads = num_threads if num_threads is not None else torch.get_num_threads()
        if spare_core is None:
            spare_core = fills_cpus(core.runner.device.type, threads,
                                    core.args.tensor_parallel_size)
        self.spare_core = SpareCore(threads, spare_core)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs, auto_step: bool = False,
                         name: str = "engine", add_quiet_s: float = ADD_QUIET_S,
                         spare_core: bool | None = None) -> EngineServicer:
        """Load the model on the thread that will run every step."""
        if engine_args.max_waiting_requests is None:
            # A service is bounded by default: overload is answered RESOURCE_EXHAUSTED at once
            # instead of a queue that grows until clients time out.
            engine_args = dataclasses.replace(engine_args,
                                              max_waiting_requests=4 * engine_args.max_num_seqs)
        binding_mode()  # an unreadable STRAND_CPU_BIND: a ValueError before the model loads
        # Before the thread exists: its first allocation picks its malloc arena for good.
        tune_cpu_allocator()
        executor = core_executor()
        core = executor.submit(EngineCore.from_engine_args, engine_args).result()
        # The first step after idle on one CPU per thread (cpu_binding.py).
        executor.submit(core.spread_team_after_idle).result()
        stats = StatsLogger(engine_args.stats_interval_s) if engine_args.log_stats else None
        threads = executor.submit(torch.get_num_threads).result()
        return cls(core, core.model_config.model_dir, executor, stats, auto_step, name,
                   add_quiet_s, num_threads=threads, spare_core=spare_core)

    @property
    def hub(self) -> OutputsHub:
        if self._hub is None:  # made on the server's loop, where its events live
            self._hub = OutputsHub(on_lost=self._subscriber_lost)
        return self._hub

    def _subscriber_lost(self) -> None:
        if self._closed:  # the stop ended the stream: no detokenizer comes after it
            return
        # Queued behind every call already submitted: what an old detokenizer's requests were
        # is settled before a new detokenizer adds anything.
        self.thread.submit(self.calls.abort_all)

    async def log_stats_periodically(self) -> None:
        """The stats line also when no step comes (the end of a burst); runs until cancelled."""
        if self.calls.stats_logger is None:
            return
        while True:
            await asyncio.sleep(max(self.calls.stats_logger.interval_s, 0.5))
            await self.thread.run(self.calls.log_stats_if_due)

    async def GetInfo(self, request: epb.EngineInfoRequest,
                      context: grpc.aio.ServicerContext) -> epb.EngineInfo:
        core = self.core
        return epb.EngineInfo(model=self.model_name, max_model_len=core.max_model_len,
                              block_size=core.block_size, num_blocks=core.num_blocks,
                              vocab_size=core.model_config.vocab_size, auto_step=self.auto_step,
                              dtype=dtype_name(core.model_config.dtype),
                              kv_cache_dtype=dtype_name(core.kv_cache_dtype),
                              labels=core.model_config.labels)

    async def Outputs(self, request: epb.EngineOutputsRequest,
                      context: grpc.aio.ServicerContext) -> AsyncIterator[epb.EngineStepOutputs]:
        async for msg in self.hub.stream():
            yield msg

    async def KvEvents(self, request: epb.EngineKvEventsRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[epb.EngineKvEvents]:
        if not self.kv_hub.enabled:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "kv_events must be on (--kv-events) to subscribe to KV events")

        async def take_snapshot() -> tuple[list[bytes], int]:
            return await self.thread.run(self.kv_hub.snapshot)

        async def drain_pending() -> None:
            await self.thread.run(self.kv_hub.drain, True)
        async for msg in self.kv_hub.stream(take_snapshot, request, drain_pending):
            yield msg

    async def Session(self, request_iterator: AsyncIterator[epb.EngineRequest],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[epb.EngineResponse]:
        """Each message's core call is queued on the core's thread as it arrives, not after the
        previous answer: a burst of adds that comes while a step runs is all in before the next
        step (read one answer at a time, each add waited for a step of its own, and a 64-stream
        burst entered over 64 steps). Calls still run in arrival order, answers go back in it,
        and at most MAX_IN_FLIGHT wait."""
        answers: asyncio.Queue[asyncio.Task[epb.EngineResponse] | None] = asyncio.Queue()
        room = asyncio.Semaphore(MAX_IN_FLIGHT)
        reader = asyncio.get_running_loop().create_task(
            self._read_session(request_iterator, answers, room))
        try:
            while (answer := await answers.get()) is not None:
                yield await answer
                room.release()
        finally:
            reader.cancel()

    async def _read_session(self, request_iterator: AsyncIterator[epb.EngineRequest],
                            answers: asyncio.Queue[asyncio.Task[epb.EngineResponse] | None],
                            room: asyncio.Semaphore) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for msg in request_iterator:
                await room.acquire()
                # Tasks start in the order they are made, and each submits its core call in its
                # first run (answer awaits nothing before): the core sees arrival order.
                answers.put_nowait(loop.create_task(self.answer(msg)))
        finally:
            answers.put_nowait(None)

    async def answer(self, msg: epb.EngineRequest) -> epb.EngineResponse:
        """One Session message: the core call on its thread; a step's outputs to the hub."""
        kind = msg.WhichOneof("kind")
        parent = context_from_carrier(msg.trace_context)
        name = "engine_step" if kind == "step" else f"strand.v1.Engine/{kind}"
        with server_span(name, parent) as span:
            try:
                if kind in ("add", "step") and not self.hub.active:
                    raise StageError(grpc.StatusCode.UNAVAILABLE,
                                     "engine stage is unavailable: no detokenizer is "
                                     "subscribed to its outputs")
                if kind == "step":
                    return await self._manual_step(msg, span)
                engine_was_idle = not self._has_work
                done = self.thread.run(self.calls.handle, msg, span)
                if kind == "add":
                    # Noted and woken while the add runs, not after: the step of a lone add is
                    # then queued on the core's one thread right behind the add and starts the
                    # moment it is done, without a round trip through this loop. (An add that
                    # fails leaves an empty step, which the core returns from at once.)
                    self._bursts.note_add(time.monotonic(), engine_was_idle)
                    self._wake()
                return await done
            except Exception as exc:  # answered in-stream: the session stays open
                span.set_attribute("error.message", str(exc))
                span.set_attribute("error.type", status_of(exc)[0].name)
                return epb.EngineResponse(seq=msg.seq, error=error_to_pb(exc))

    async def _manual_step(self, msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        if self.auto_step:
            raise ValueError("the engine steps itself (auto mode): Step messages are refused")
        outputs = await self.thread.run(lambda: core_outputs_to_pb(self.calls.step(span)))
        out = epb.EngineStepOutputs(step_id=msg.step.step_id, origin=msg.step.origin,
                                    outputs=outputs, trace_context=carrier_from_context())
        if not await self.hub.put(out):
            raise StageError(grpc.StatusCode.UNAVAILABLE,
                             "engine stage is unavailable: its detokenizer went away")
        return epb.EngineResponse(seq=msg.seq, state=epb.EngineState(
            num_unfinished_requests=self.calls.num_unfinished))

    # -- auto mode ------------------------------------------------------------------------------

    def _wake(self) -> None:
        self._has_work = True
        self._wakes += 1
        if self._work is not None:
            self._work.set()

    async def auto_loop(self) -> None:
        """Auto mode: step while there is work and a subscriber; runs until cancelled."""
        self._work = asyncio.Event()
        loop = asyncio.get_running_loop()
        while True:
            if not (self._has_work and self.hub.active):
                self._work.clear()
                self.hub.changed.clear()
                waits = [asyncio.ensure_future(e.wait()) for e in (self._work, self.hub.changed)]
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()
                continue
            await self._let_a_burst_of_adds_in()
            wakes = self._wakes
            more = await self.thread.run_step_loop(self._auto_steps, loop)
            # An add that came while the steps ran is queued behind them on the core's thread
            # (woken before it runs, see answer): they could not count it, but it is work.
            self._has_work = more or self._wakes != wakes
            while self._deliveries:  # the hub took every step (a slow detokenizer holds us)
                await self._deliveries.popleft()
            await asyncio.sleep(0)  # Session messages (adds, aborts) between steps

    async def _let_a_burst_of_adds_in(self) -> None:
        held_since = time.monotonic()
        while self._bursts.hold(time.monotonic(), held_since):
            await asyncio.sleep(self._bursts.quiet_s)

    def _auto_steps(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Steps on the core's thread, back to back while step_driver.BackToBack says so; each
        message goes to the loop the moment its step ends (core_thread.py). Whether work
        remains."""
        while True:
            started = time.perf_counter()
            # After a first token at low load, a core for its way out (spare_core.py).
            self.spare_core.before_step(self.core.decodes_only)
            try:
                msg, more, outputs = self._auto_step_once()
            finally:
                self.spare_core.restore()
            step_s = time.perf_counter() - started
            short = step_s < self.back_to_back.min_s
            self.spare_core.after_step(outputs, short, self.core.get_num_unfinished_requests())
            if msg is not None:
                self._posted += 1
                loop.call_soon_threadsafe(self._deliver, msg)
            if not self.back_to_back.go_on(
                    more=more, step_s=step_s, has_message=msg is not None,
                    subscribed=self.hub.active, others_waiting=self.thread.others_waiting,
                    undelivered=self._posted - self._delivered):
                return more

    def _deliver(self, msg: epb.EngineStepOutputs) -> None:
        """On the loop: a step's message into the hub, in the order the steps ran: at once when
        no earlier put waits and the hub has room (a task would first need a turn of the loop of
        its own, on the way to every token), else by a task that waits for room."""
        if not self._deliveries and self.hub.offer(msg):
            self._delivered += 1
            return

        async def put() -> None:
            await self.hub.put(msg)
            self._delivered += 1
        self._deliveries.append(asyncio.get_running_loop().create_task(put()))

    def _auto_step_once(self) -> tuple[epb.EngineStepOutputs | None, bool, EngineCoreOutputs]:
        """One step and its message, both on the core's thread: the event loop only queues it
        (and gRPC sends it while the next step computes); whether work remains; the outputs."""
        with server_span("engine_step", otel_context.Context()) as span:
            outputs = self.calls.step(span)
        msg = None
        if outputs.outputs or outputs.finished_requests:
            msg = epb.EngineStepOutputs(outputs=core_outputs_to_pb(outputs))
        return msg, self.core.has_unfinished_requests(), outputs

    def close(self) -> None:
        self._closed = True
        # On the core's thread, after any step in flight: tensor-parallel workers get their
        # shutdown in order with the steps they were sent (no-op with one rank).
        self.thread.submit(self.core.shutdown)
        self._executor.shutdown(wait=False)
