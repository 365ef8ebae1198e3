"""Engine-wide control calls of the gateway (Control service): they touch no client's requests,
reach every engine replica (one engine is a single replica), and the ones that change the cache
run between steps, as in process. Answers report per replica (strand/services/gateway/replica_reports)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.engine_replicas import EngineReplicas
from strand.services.common.status import StageError
from strand.services.common.tracing import carrier_from_context
from strand.services.gateway.kv_event_feed import KvEventFeed
from strand.services.gateway.replica_reports import (
    answers,
    cleared_report,
    lookup_report,
    reset_report,
)


class GatewayControl:
    def __init__(self, engines: EngineReplicas, step_lock: asyncio.Lock) -> None:
        self.engines = engines
        self.kv_feed = KvEventFeed(engines)
        self._step_lock = step_lock

    async def close(self) -> None:
        await self.kv_feed.close()

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

    async def _everywhere(self, **kind: Any) -> list[epb.EngineResponse]:
        """One call on every replica between steps; engine-wide means all of them, so any
        replica's failure is the call's."""
        carrier = carrier_from_context()
        async with self._step_lock:
            results = await self.engines.fan_out(
                lambda _: epb.EngineRequest(**kind, trace_context=carrier))
        for result in results.values():
            if isinstance(result, StageError):
                raise result
        return list(results.values())

    async def engine_call(self, **kind: Any) -> epb.EngineState:
        """sleep, wake_up, profile or query on every replica: the first replica's state, with
        is_sleeping true when any replica sleeps and every replica's profile trace path."""
        states = [r.state for r in await self._everywhere(**kind)]
        state = epb.EngineState()
        state.CopyFrom(states[0])
        state.is_sleeping = any(s.is_sleeping for s in states)
        state.profile_path = ",".join(s.profile_path for s in states if s.profile_path)
        return state

    async def lora(self, call: epb.EngineLoraCall) -> epb.EngineLoraResult:
        """add_lora / remove_lora / list_loras / pin_lora on every replica (a request may be
        routed to any of them): success where every replica succeeded, and the adapters loaded
        on all of them."""
        results = [r.lora for r in await self._everywhere(lora=call)]
        loaded = set(results[0].lora_ids).intersection(*(r.lora_ids for r in results[1:]))
        return epb.EngineLoraResult(success=all(r.success for r in results),
                                    lora_ids=sorted(loaded))

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

    async def kv_events(self, resume: dict[str, tuple[int, str]] | None = None
                        ) -> AsyncIterator[pb.KvEventBatch]:
        """Every replica's KV event batches as they come (each with its own sequence numbers:
        a gap shows what was dropped), each replica's opening with the batches from `resume`
        (seq, epoch) or a snapshot batch."""
        async for batch in self.kv_feed.subscribe(resume):
            yield batch
