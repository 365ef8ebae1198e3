"""FlushCache, Start/StopProfile and GetLoads: the gateway's Control calls in vLLM's terms."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import TypeAlias

import grpc
from smg_grpc_proto.generated import common_pb2 as cmn
from smg_grpc_proto.generated import vllm_engine_pb2 as vpb

from strand import __version__
from strand.services._proto.strand.v1 import control_pb2 as cpb
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.vllm_grpc.link import GatewayLink

RETRY_S = 0.1  # FlushCache's pause between attempts while requests are in flight
IMMEDIATE_BUDGET_S = 30.0  # timeout_s 0: one attempt, bounded all the same
# StartProfile's options that Strand's profiler takes at the engine's launch, not per request.
_LAUNCH_OPTIONS = ("output_dir", "start_step", "num_steps", "with_stack", "record_shapes")
Context: TypeAlias = grpc.aio.ServicerContext


async def flush_cache(link: GatewayLink, request: cmn.FlushCacheRequest, context: Context
                      ) -> cmn.FlushCacheResponse:
    """reset_prefix_cache without preempting: retried until the engine is idle or timeout_s
    runs out (0: one attempt). Running requests are never reset for it."""
    timeout_s = request.timeout_s
    if not math.isfinite(timeout_s) or timeout_s < 0:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"timeout_s: must be finite and >= 0, got {timeout_s}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (timeout_s or IMMEDIATE_BUDGET_S)
    reset = gpb.ResetPrefixCacheRequest(reset_running_requests=False)
    while True:
        left = deadline - loop.time()
        try:
            resp = await link.control_call("ResetPrefixCache", reset, timeout=max(left, 0.01))
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:  # type: ignore[attr-defined]
                break
            await context.abort(exc.code(), f"Flush cache failed: "  # type: ignore[attr-defined]
                                f"{exc.details()}")  # type: ignore[attr-defined]
        if resp.success:
            return cmn.FlushCacheResponse(success=True,
                                          message="Local KV prefix cache flushed successfully")
        if timeout_s == 0:
            return cmn.FlushCacheResponse(
                success=False, message="KV prefix cache reset refused; requests are in flight")
        if deadline - loop.time() <= 0:
            break
        await asyncio.sleep(min(RETRY_S, max(0.0, deadline - loop.time())))
    message = (f"Flush cache timed out after {timeout_s:g}s: requests were still in flight "
               "(nothing was flushed)")
    context.set_code(grpc.StatusCode.DEADLINE_EXCEEDED)
    context.set_details(message)
    return cmn.FlushCacheResponse(success=False, message=message)


async def start_profile(link: GatewayLink, request: cmn.StartProfileRequest, context: Context
                        ) -> cmn.ProfileResponse:
    named = [name for name in _LAUNCH_OPTIONS if request.HasField(name)]
    named += ["activities"] if request.activities else []
    named += ["profile_by_stage"] if request.profile_by_stage else []
    if named:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"{', '.join(named)}: cannot be set per request; Strand's profiler "
                            "writes under the engine's STRAND_TORCH_PROFILER_DIR, set at launch")
    await _control(link, context, "StartProfile", cpb.StartProfileRequest())
    return cmn.ProfileResponse(success=True, message="Start profiling succeeded")


async def stop_profile(link: GatewayLink, context: Context) -> cmn.ProfileResponse:
    resp = await _control(link, context, "StopProfile", cpb.StopProfileRequest())
    return cmn.ProfileResponse(success=True,
                               message=f"Stop profiling succeeded: {resp.trace_path}")


async def get_loads(link: GatewayLink) -> vpb.GetLoadsResponse:
    """The stack as one worker (rank 0): its engine replicas' loads summed."""
    loads = (await link.control_call("GetLoads", cpb.GetLoadsRequest())).loads
    return vpb.GetLoadsResponse(timestamp=datetime.now(UTC).isoformat(),
                                version=f"strand {__version__}", dp_rank_count=1,
                                loads=[scheduler_load(loads)])


def scheduler_load(loads: Iterable[pb.EngineLoad]) -> vpb.SchedulerLoad:
    items = list(loads)
    running = sum(int(x.num_running) for x in items)
    waiting = sum(int(x.num_waiting) for x in items)
    used = sum(int(x.kv_blocks_used) for x in items)
    total = used + sum(int(x.kv_blocks_free) for x in items)
    queries = sum(int(x.prefix_cache_queries) for x in items)
    hits = sum(int(x.prefix_cache_hits) for x in items)
    return vpb.SchedulerLoad(
        dp_rank=0, num_running_reqs=running, num_waiting_reqs=waiting,
        num_total_reqs=running + waiting,
        num_used_tokens=sum(int(x.tokens_in_flight) for x in items),
        token_usage=used / total if total else 0.0,
        cache_hit_rate=hits / queries if queries else 0.0)


async def _control(link: GatewayLink, context: Context, method: str,
                   request: object) -> cpb.StopProfileResponse:
    try:
        return await link.control_call(method, request, timeout=600.0)
    except grpc.RpcError as exc:
        await context.abort(exc.code(), str(exc.details()))  # type: ignore[attr-defined]
        raise
