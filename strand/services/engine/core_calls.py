"""The engine stage's calls on its EngineCore, on the core's one thread: Session messages to
core methods and back to protobuf, each step's span attributes and the stats line."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from strand.engine_core.core.engine import EngineCore
from strand.engine_core.core.engine_io import EngineCoreOutputs
from strand.engine_core.core.sched_output import SchedulerOutput
from strand.engine_core.stats_logger import StatsLogger, prompt_tokens_of
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.convert import core_request_from_pb, lora_request_from_pb
from strand.services.common.convert_kv_events import kv_event_batch_to_pb
from strand.services.engine.final_only_hold import FinalOnlyHold


class CoreCalls:
    def __init__(self, core: EngineCore, stats_logger: StatsLogger | None, name: str) -> None:
        self.core = core
        self.stats_logger = stats_logger  # --log-stats: the periodic throughput/KV line
        self.name = name  # how GetLoads names this engine
        self.num_unfinished = 0  # after the last call: read from the loop without a core call
        # Run on the core's thread after every call (the KV events hub takes new events).
        self.after_call: Callable[[], None] = lambda: None
        # FINAL_ONLY requests' tokens until they end (final_only_hold.py); None sends every step's.
        self.hold: FinalOnlyHold | None = FinalOnlyHold()

    def handle(self, msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        kind = msg.WhichOneof("kind")
        handler = _HANDLERS.get(kind or "")
        if handler is None:
            raise ValueError(f"kind must be one of {', '.join(sorted(_HANDLERS))} or step, "
                             f"got {kind!r}")
        try:
            resp = handler(self, msg, span)
        finally:
            self.after_call()
        self.num_unfinished = self.core.get_num_unfinished_requests()
        return resp

    # -- one handler per Session message kind: (self, message, span) -> response ------------

    def _on_clear_kv_cache(self, msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        req = msg.clear_kv_cache
        event_id, num_tokens = self.core.clear_kv_cache(req.instance_id, req.location)
        span.set_attribute("strand.kv.location", req.location)
        return epb.EngineResponse(seq=msg.seq, cleared=epb.KvCacheCleared(
            event_id=event_id, num_tokens_cleared=num_tokens))

    def _on_lookup_kv_cache(self, msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        found = self.core.lookup_kv_cache(list(msg.lookup_kv_cache.token_ids))
        return epb.EngineResponse(seq=msg.seq, lookup=epb.KvCacheLookup(num_cached_tokens=found))

    def _on_get_loads(self, msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        return epb.EngineResponse(seq=msg.seq, load=self.load())

    def _on_take_kv_events(self, msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        # ValueError (INVALID_ARGUMENT) names --kv-events when the engine records none.
        batch = self.core.take_kv_events()
        batches = [kv_event_batch_to_pb(batch, self.name)] if batch is not None else []
        return epb.EngineResponse(seq=msg.seq,
                                  kv_events_batches=epb.KvEventBatches(batches=batches))

    def _on_add(self, msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        self._add(list(msg.add.requests), span)
        return self._state(msg.seq, epb.EngineState())

    def _on_abort(self, msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        request_ids = list(msg.abort.request_ids)
        self.core.abort_requests(request_ids)
        if self.hold is not None:
            self.hold.forget(request_ids)
        return self._state(msg.seq, epb.EngineState())

    def _on_reset_prefix_cache(self, msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        req = msg.reset_prefix_cache
        tiers = self.core.reset_prefix_cache_tiers(req.reset_running_requests,
                                                   req.reset_connector)
        state = epb.EngineState(reset_ok=all(t.reset for t in tiers))
        state.tiers.extend(pb.TierReset(tier=t.tier, reset=t.reset, num_blocks=t.num_blocks,
                                        num_bytes=t.num_bytes) for t in tiers)
        return self._state(msg.seq, state)

    def _on_query(self, msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        held = self.core.scheduler.requests
        return self._state(msg.seq, epb.EngineState(missing_request_ids=[
            r for r in msg.query.request_ids if r not in held]))

    def _on_sleep(self, msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        self.core.sleep(msg.sleep.level if msg.sleep.HasField("level") else 1)
        return self._state(msg.seq, epb.EngineState())

    def _on_wake_up(self, msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        self.core.wake_up(list(msg.wake_up.tags) or None)
        return self._state(msg.seq, epb.EngineState())

    def _on_profile(self, msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        state = epb.EngineState()
        if msg.profile.start:
            self.core.start_profile()
        else:
            state.profile_path = self.core.stop_profile()
        return self._state(msg.seq, state)

    def _on_lora(self, msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        return epb.EngineResponse(seq=msg.seq, lora=self.lora(msg.lora))

    def _state(self, seq: int, state: epb.EngineState) -> epb.EngineResponse:
        state.num_unfinished_requests = self.core.get_num_unfinished_requests()
        state.is_sleeping = self.core.is_sleeping()
        state.supported_tasks.extend(self.core.get_supported_tasks())
        return epb.EngineResponse(seq=seq, state=state)

    def _add(self, pb_requests: list[Any], span: Any) -> None:
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
        if self.hold is not None:
            self.hold.added(requests)
        span.set_attribute("gen_ai.request.ids", added)

    def lora(self, call: epb.EngineLoraCall) -> epb.EngineLoraResult:
        """One of EngineCore's LoRA calls (ValueError, INVALID_ARGUMENT, for a bad one)."""
        core, which = self.core, call.WhichOneof("call")
        if which == "add":
            success = core.add_lora(lora_request_from_pb(call.add))
        elif which == "remove":
            success = core.remove_lora(call.remove)
        elif which == "pin":
            success = core.pin_lora(call.pin)
        elif which == "list":
            success = True
        else:
            raise ValueError(f"lora call must be add, remove, list or pin, got {which!r}")
        return epb.EngineLoraResult(success=success, lora_ids=sorted(core.list_loras()))

    def load(self) -> pb.EngineLoad:
        scheduler = self.core.scheduler
        pool = scheduler.kv_cache_manager.block_pool
        free = pool.get_num_free_blocks()
        in_flight = sum(r.num_tokens for r in scheduler.requests.values())
        prefix = scheduler.kv_cache_manager.prefix_cache_stats
        return pb.EngineLoad(engine=self.name, num_running=len(scheduler.running),
                             num_waiting=len(scheduler.waiting),
                             kv_blocks_used=pool.num_blocks - 1 - free, kv_blocks_free=free,
                             tokens_in_flight=in_flight, prefix_cache_queries=prefix.queries,
                             prefix_cache_hits=prefix.hits)

    def abort_all(self) -> None:
        self.core.abort_requests(list(self.core.scheduler.requests))
        if self.hold is not None:
            self.hold.clear()
        self.after_call()
        self.num_unfinished = self.core.get_num_unfinished_requests()

    def step(self, span: Any) -> EngineCoreOutputs:
        core = self.core
        # Cleared first: a step with nothing to do schedules nothing and leaves it None.
        core.last_scheduler_output = None
        try:
            outputs = core.step()
        finally:
            self.after_call()
        self.num_unfinished = core.get_num_unfinished_requests()
        record_step(span, core.last_scheduler_output, len(outputs.outputs))
        if self.stats_logger is not None:
            self.stats_logger.count(prompt_tokens_of(core.last_scheduler_output),
                                    sum(len(o.new_token_ids) for o in outputs.outputs))
            self.stats_logger.log_if_due(core.get_stats())
        if self.hold is None:
            return outputs
        outputs = self.hold.apply(outputs)
        # After apply: a request that ended this step has left the core, its output not this.
        self.hold.prune(core.scheduler.requests)
        return outputs

    def log_stats_if_due(self) -> None:
        if self.stats_logger is not None:
            self.stats_logger.log_if_due(self.core.get_stats())


# The Session message kinds the core's thread answers ("step" is the servicer's: it also feeds
# the outputs hub). A table rather than an if-chain: a new kind is one method and one entry.
_HANDLERS: dict[str, Callable[[CoreCalls, epb.EngineRequest, Any], epb.EngineResponse]] = {
    "add": CoreCalls._on_add,
    "abort": CoreCalls._on_abort,
    "reset_prefix_cache": CoreCalls._on_reset_prefix_cache,
    "query": CoreCalls._on_query,
    "clear_kv_cache": CoreCalls._on_clear_kv_cache,
    "lookup_kv_cache": CoreCalls._on_lookup_kv_cache,
    "get_loads": CoreCalls._on_get_loads,
    "take_kv_events": CoreCalls._on_take_kv_events,
    "lora": CoreCalls._on_lora,
    "sleep": CoreCalls._on_sleep,
    "wake_up": CoreCalls._on_wake_up,
    "profile": CoreCalls._on_profile,
}


def record_step(span: Any, sched: SchedulerOutput | None, num_outputs: int) -> None:
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
    if sched.preempted_req_ids:
        # Where the engine knows it: the requests this step's schedule preempted (recomputed
        # later), as an event on the step's span.
        span.add_event("strand.preemption",
                       {"gen_ai.request.ids": sorted(sched.preempted_req_ids)})
