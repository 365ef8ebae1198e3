"""Engine-wide Control answers from every engine replica's: the aggregate a single-engine
client reads (success only when every replica succeeded, sums, the best lookup) and the
per-replica report beside it. A replica that could not answer (it is down) is reported with
its error; bad input (the same for every replica) fails the whole call."""

from __future__ import annotations

from typing import Any

import grpc

from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.status import StageError


def answers(results: dict[str, Any]) -> dict[str, Any]:
    """The replicas' answers; raises bad input at once, and UNAVAILABLE when none answered."""
    errors = [r for r in results.values() if isinstance(r, StageError)]
    for error in errors:
        if error.code != grpc.StatusCode.UNAVAILABLE:
            raise error
    if len(errors) == len(results):
        raise errors[0]
    return results


def _error(result: Any) -> str:
    return result.message if isinstance(result, StageError) else ""


def reset_report(results: dict[str, Any]) -> gpb.ResetPrefixCacheResponse:
    out = gpb.ResetPrefixCacheResponse(success=True)
    tiers: dict[str, pb.TierReset] = {}
    for engine, result in answers(results).items():
        if isinstance(result, StageError):
            out.success = False
            out.replicas.append(gpb.ReplicaResetPrefixCache(engine=engine, error=result.message))
            continue
        state = result.state
        out.success = out.success and state.reset_ok
        out.replicas.append(gpb.ReplicaResetPrefixCache(engine=engine, success=state.reset_ok,
                                                        tiers=state.tiers))
        for tier in state.tiers:
            total = tiers.setdefault(tier.tier, pb.TierReset(tier=tier.tier, reset=True))
            total.reset = total.reset and tier.reset
            total.num_blocks += tier.num_blocks
            total.num_bytes += tier.num_bytes
    out.tiers.extend(tiers.values())
    return out


def cleared_report(results: dict[str, Any]) -> gpb.ClearKvCacheResponse:
    out = gpb.ClearKvCacheResponse()
    event_ids: list[str] = []
    for engine, result in answers(results).items():
        if isinstance(result, StageError):
            out.replicas.append(gpb.ReplicaKvCleared(engine=engine, error=_error(result)))
            continue
        cleared = result.cleared
        event_ids.append(cleared.event_id)
        out.num_tokens_cleared += cleared.num_tokens_cleared
        out.replicas.append(gpb.ReplicaKvCleared(engine=engine, event_id=cleared.event_id,
                                                 num_tokens_cleared=cleared.num_tokens_cleared))
    out.event_id = ",".join(event_ids)
    return out


def lookup_report(results: dict[str, Any]) -> gpb.LookupKvCacheResponse:
    out = gpb.LookupKvCacheResponse()
    for engine, result in answers(results).items():
        if isinstance(result, StageError):
            out.replicas.append(gpb.ReplicaKvLookup(engine=engine, error=_error(result)))
            continue
        found = result.lookup.num_cached_tokens
        out.replicas.append(gpb.ReplicaKvLookup(engine=engine, num_cached_tokens=found))
        for location, num in found.items():
            out.num_cached_tokens[location] = max(out.num_cached_tokens[location], num)
    return out


def replica_infos(infos: dict[str, epb.EngineInfo | StageError], in_rotation: list[str]
                  ) -> list[gpb.ReplicaInfo]:
    """GetServerInfo's list of replicas, in the order they were named."""
    out = []
    for engine, info in infos.items():
        blocks = 0 if isinstance(info, StageError) else int(info.num_blocks)
        out.append(gpb.ReplicaInfo(engine=engine, healthy=engine in in_rotation,
                                   num_blocks=blocks))
    return sorted(out, key=lambda r: r.engine)
