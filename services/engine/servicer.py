"""Engine servicer: each stream message is one call on the EngineCore, run off the event loop.

Every torch call of the process (model load included) runs on one thread, the core's. libgomp
keeps a team of OpenMP workers per thread that starts parallel work, and once it manages more
threads than there are CPUs it stops spin-waiting between parallel regions: a model loaded on the
main thread and stepped on another left a second, idle team behind, and every GEMM of every step
then put its workers to sleep and woke them again (tens of thousands of context switches per
benchmark run, 12% slower on 2 cores).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc

from engine_core.config import EngineArgs
from engine_core.core.sched_output import SchedulerOutput
from engine_core.engine_core import EngineCore
from engine_core.model_executor.cpu_allocator import tune_cpu_allocator
from engine_core.stats_logger import StatsLogger, prompt_tokens_of
from services._proto.strand.v1 import engine_pb2 as epb
from services._proto.strand.v1 import engine_pb2_grpc
from services.common.convert import core_outputs_to_pb, core_request_from_pb
from services.common.ownership import SessionOwnership
from services.common.status import error_to_pb
from services.common.tracing import context_from_carrier, server_span

# Engine steps one Step message may ask for (EngineStep.num_steps).
MAX_STEPS_PER_CALL = 64


def core_executor() -> ThreadPoolExecutor:
    # One thread: the core is not thread-safe, and the loop must stay free for health checks.
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-core")


class EngineServicer(engine_pb2_grpc.EngineServicer):
    def __init__(self, core: EngineCore, model_name: str,
                 executor: ThreadPoolExecutor | None = None,
                 stats_logger: StatsLogger | None = None) -> None:
        self.core = core
        self.model_name = model_name
        self.stats_logger = stats_logger  # --log-stats: the periodic throughput/KV line
        # The thread that built the core (see the module docstring), or a new one.
        self._executor = executor or core_executor()
        self._owners = SessionOwnership()

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> EngineServicer:
        """Load the model on the thread that will run every step."""
        # Before the thread exists: its first allocation picks its malloc arena for good.
        tune_cpu_allocator()
        executor = core_executor()
        core = executor.submit(EngineCore.from_engine_args, engine_args).result()
        stats = StatsLogger(engine_args.stats_interval_s) if engine_args.log_stats else None
        return cls(core, core.model_config.model_dir, executor, stats)

    async def log_stats_periodically(self) -> None:
        """The stats line also when no step comes (the end of a burst); runs until cancelled."""
        if self.stats_logger is None:
            return
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(self.stats_logger.interval_s, 0.5))
            await loop.run_in_executor(self._executor, self._log_stats_if_due)

    def _log_stats_if_due(self) -> None:
        if self.stats_logger is not None:
            self.stats_logger.log_if_due(self.core.get_stats())

    async def GetInfo(self, request: epb.EngineInfoRequest,
                      context: grpc.aio.ServicerContext) -> epb.EngineInfo:
        core = self.core
        return epb.EngineInfo(model=self.model_name, max_model_len=core.max_model_len,
                              block_size=core.block_size, num_blocks=core.num_blocks,
                              vocab_size=core.model_config.vocab_size)

    async def Session(self, request_iterator: AsyncIterator[epb.EngineRequest],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[epb.EngineResponse]:
        loop = asyncio.get_running_loop()
        session = self._owners.new_session()
        try:
            async for msg in request_iterator:
                yield await loop.run_in_executor(self._executor, self.handle, msg, session)
        finally:
            # The gateway is gone: nobody would ever collect or abort what it added.
            orphans = self._owners.release(session)
            if orphans:
                # Submitted, not awaited: this task is being cancelled. The one worker thread
                # keeps it in order with every other core call.
                self._executor.submit(self.core.abort_requests, orphans)

    def handle(self, msg: epb.EngineRequest, session: int = 0) -> epb.EngineResponse:
        kind = msg.WhichOneof("kind")
        parent = context_from_carrier(msg.trace_context)
        name = "engine_step" if kind == "step" else f"strand.v1.Engine/{kind}"
        with server_span(name, parent) as span:
            try:
                return self._dispatch(msg, kind, span, session)
            except Exception as exc:  # answered in-stream: the session stays open
                span.set_attribute("error.message", str(exc))
                return epb.EngineResponse(seq=msg.seq, error=error_to_pb(exc))

    def _dispatch(self, msg: epb.EngineRequest, kind: str | None, span: Any, session: int
                  ) -> epb.EngineResponse:
        core, seq = self.core, msg.seq
        reset_ok = False
        if kind == "step":
            return self._step(seq, span, msg.step.num_steps or 1)
        if kind == "clear_kv_cache":
            req = msg.clear_kv_cache
            event_id, num_tokens = core.clear_kv_cache(req.instance_id, req.location)
            span.set_attribute("strand.kv.location", req.location)
            return epb.EngineResponse(seq=seq, cleared=epb.KvCacheCleared(
                event_id=event_id, num_tokens_cleared=num_tokens))
        if kind == "lookup_kv_cache":
            found = core.lookup_kv_cache(list(msg.lookup_kv_cache.token_ids))
            return epb.EngineResponse(seq=seq, lookup=epb.KvCacheLookup(
                num_cached_tokens=found))
        if kind == "add":
            self._add(list(msg.add.requests), span, session)
        elif kind == "abort":
            core.abort_requests(list(msg.abort.request_ids))
            self._owners.discard(msg.abort.request_ids)
        elif kind == "reset_prefix_cache":
            req = msg.reset_prefix_cache
            reset_ok = core.reset_prefix_cache(req.reset_running_requests, req.reset_connector)
        elif kind != "query":
            raise ValueError(f"kind must be add, step, abort, reset_prefix_cache, query, "
                             f"clear_kv_cache or lookup_kv_cache, got {kind!r}")
        state = epb.EngineState(num_unfinished_requests=core.get_num_unfinished_requests(),
                                reset_ok=reset_ok)
        return epb.EngineResponse(seq=seq, state=state)

    def _add(self, pb_requests: list[Any], span: Any, session: int) -> None:
        # Convert all first: a bad one must leave the core unchanged.
        requests = [core_request_from_pb(r) for r in pb_requests]
        added: list[str] = []
        try:
            for request in requests:
                self.core.add_request(request)
                added.append(request.request_id)
        except Exception:
            self.core.abort_requests(added)
            raise
        self._owners.add(session, added)
        span.set_attribute("gen_ai.request.ids", added)

    def _step(self, seq: int, span: Any, num_steps: int = 1) -> epb.EngineResponse:
        if num_steps > MAX_STEPS_PER_CALL:
            raise ValueError(f"num_steps must be <= {MAX_STEPS_PER_CALL}, got {num_steps}")
        core = self.core
        # Cleared first: a step with nothing to do schedules nothing and leaves it None.
        core.last_scheduler_output = None
        outputs = core.step()
        prompt_tokens = prompt_tokens_of(core.last_scheduler_output)
        for _ in range(num_steps - 1):
            if not core.has_unfinished_requests():
                break
            more = core.step()  # its outputs follow the earlier step's, in step order
            prompt_tokens += prompt_tokens_of(core.last_scheduler_output)
            outputs.outputs.extend(more.outputs)
            outputs.finished_requests |= more.finished_requests
            outputs.timestamp, outputs.scheduler_stats = more.timestamp, more.scheduler_stats
        self._owners.discard(o.request_id for o in outputs.outputs if o.finished)
        span.set_attribute("strand.step.num_steps", num_steps)
        self._record_step(span, core.last_scheduler_output, len(outputs.outputs))
        if self.stats_logger is not None:
            self.stats_logger.count(prompt_tokens,
                                    sum(len(o.new_token_ids) for o in outputs.outputs))
            self.stats_logger.log_if_due(core.get_stats())
        return epb.EngineResponse(seq=seq, outputs=core_outputs_to_pb(outputs))

    @staticmethod
    def _record_step(span: Any, sched: SchedulerOutput | None, num_outputs: int) -> None:
        span.set_attribute("strand.step.num_outputs", num_outputs)
        if sched is None:
            span.set_attribute("strand.step.batch_size", 0)
            return
        new_ids = {r.req_id for r in sched.scheduled_new_reqs}
        # A step's prefill tokens: new requests' chunks, and any chunk longer than one token.
        prefill = sum(n for rid, n in sched.num_scheduled_tokens.items()
                      if rid in new_ids or n > 1)
        span.set_attribute("strand.step.batch_size", sched.num_reqs)
        span.set_attribute("strand.step.scheduled_tokens", sched.total_num_scheduled_tokens)
        span.set_attribute("strand.step.prefill_tokens", prefill)

    def close(self) -> None:
        self._executor.shutdown(wait=False)
