"""Engine-wide control calls of the gateway (Control service): they touch no client's requests,
and the ones that change the cache run between steps, as in process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from services._proto.strand.v1 import engine_pb2 as epb
from services._proto.strand.v1 import types_pb2 as pb
from services.common.stage_client import StageClient
from services.common.tracing import carrier_from_context
from services.gateway.kv_event_feed import KvEventFeed


class GatewayControl:
    def __init__(self, engine: StageClient, step_lock: asyncio.Lock) -> None:
        self.engine = engine
        self.kv_feed = KvEventFeed(engine)
        self._step_lock = step_lock

    async def reset_prefix_cache(self, reset_running_requests: bool, reset_connector: bool
                                 ) -> epb.EngineState:
        async with self._step_lock:
            resp = await self.engine.call(epb.EngineRequest(
                reset_prefix_cache=epb.EngineResetPrefixCache(
                    reset_running_requests=reset_running_requests,
                    reset_connector=reset_connector),
                trace_context=carrier_from_context()))
        return resp.state  # type: ignore[no-any-return]

    async def engine_call(self, **kind: Any) -> epb.EngineState:
        """One engine-wide call (sleep, wake_up, profile, query) between steps: its state."""
        async with self._step_lock:
            resp = await self.engine.call(epb.EngineRequest(
                **kind, trace_context=carrier_from_context()))
        return resp.state  # type: ignore[no-any-return]

    async def clear_kv_cache(self, instance_id: str, location: str) -> tuple[str, int]:
        """EngineCore.clear_kv_cache: (event id, number of tokens cleared)."""
        async with self._step_lock:
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

    async def get_loads(self) -> list[pb.EngineLoad]:
        resp = await self.engine.call(epb.EngineRequest(get_loads=epb.EngineGetLoads()))
        return [resp.load]

    async def kv_events(self) -> AsyncIterator[pb.KvEventBatch]:
        """The engine's KV event batches as they come (polled: the engine keeps them in a
        bounded buffer with consecutive sequence numbers, so a gap shows what was dropped)."""
        async for batch in self.kv_feed.subscribe():
            yield batch
