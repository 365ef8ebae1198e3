"""The engine stage's calls on its EngineCore, on the core's one thread: Session messages to
core methods and back to protobuf, each step's span attributes and the stats line."""

from __future__ import annotations

from typing import Any

from engine_core.core.engine_io import EngineCoreOutputs
from engine_core.core.sched_output import SchedulerOutput
from engine_core.engine_core import EngineCore
from engine_core.stats_logger import StatsLogger, prompt_tokens_of
from services._proto.strand.v1 import engine_pb2 as epb
from services._proto.strand.v1 import types_pb2 as pb
from services.common.convert import core_request_from_pb, lora_request_from_pb
from services.common.convert_kv_events import kv_event_batch_to_pb


class CoreCalls:
    def __init__(self, core: EngineCore, stats_logger: StatsLogger | None, name: str) -> None:
        self.core = core
        self.stats_logger = stats_logger  # --log-stats: the periodic throughput/KV line
        self.name = name  # how GetLoads names this engine
        self.num_unfinished = 0  # after the last call: read from the loop without a core call

    def handle(self, msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        kind = msg.WhichOneof("kind")
        resp = self._dispatch(msg, kind, span)
        self.num_unfinished = self.core.get_num_unfinished_requests()
        return resp

    def _dispatch(self, msg: epb.EngineRequest, kind: str | None, span: Any
                  ) -> epb.EngineResponse:
        core, seq = self.core, msg.seq
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
        if kind == "lora":
            return epb.EngineResponse(seq=seq, lora=self.lora(msg.lora))
        if kind == "get_loads":
            return epb.EngineResponse(seq=seq, load=self.load())
        if kind == "take_kv_events":
            # ValueError (INVALID_ARGUMENT) names --kv-events when the engine records none.
            batch = core.take_kv_events()
            batches = [kv_event_batch_to_pb(batch, self.name)] if batch is not None else []
            return epb.EngineResponse(seq=seq, kv_events_batches=epb.KvEventBatches(
                batches=batches))
        state = epb.EngineState()
        if kind == "add":
            self._add(list(msg.add.requests), span)
        elif kind == "abort":
            core.abort_requests(list(msg.abort.request_ids))
        elif kind == "reset_prefix_cache":
            req = msg.reset_prefix_cache
            tiers = core.reset_prefix_cache_tiers(req.reset_running_requests,
                                                  req.reset_connector)
            state.reset_ok = all(t.reset for t in tiers)
            state.tiers.extend(pb.TierReset(tier=t.tier, reset=t.reset, num_blocks=t.num_blocks,
                                            num_bytes=t.num_bytes) for t in tiers)
        elif kind != "query":
            raise ValueError(f"kind must be add, step, abort, reset_prefix_cache, query, "
                             f"clear_kv_cache, lookup_kv_cache, get_loads, take_kv_events or lora, got {kind!r}")
        state.num_unfinished_requests = core.get_num_unfinished_requests()
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
        return pb.EngineLoad(engine=self.name, num_running=len(scheduler.running),
                             num_waiting=len(scheduler.waiting),
                             kv_blocks_used=pool.num_blocks - 1 - free, kv_blocks_free=free,
                             tokens_in_flight=in_flight)

    def abort_all(self) -> None:
        self.core.abort_requests(list(self.core.scheduler.requests))
        self.num_unfinished = self.core.get_num_unfinished_requests()

    def step(self, span: Any) -> EngineCoreOutputs:
        core = self.core
        # Cleared first: a step with nothing to do schedules nothing and leaves it None.
        core.last_scheduler_output = None
        outputs = core.step()
        self.num_unfinished = core.get_num_unfinished_requests()
        record_step(span, core.last_scheduler_output, len(outputs.outputs))
        if self.stats_logger is not None:
            self.stats_logger.count(prompt_tokens_of(core.last_scheduler_output),
                                    sum(len(o.new_token_ids) for o in outputs.outputs))
            self.stats_logger.log_if_due(core.get_stats())
        return outputs

    def log_stats_if_due(self) -> None:
        if self.stats_logger is not None:
            self.stats_logger.log_if_due(self.core.get_stats())


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
