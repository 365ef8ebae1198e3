"""Whether each engine replica steps itself (auto mode), as its GetInfo says, asked once per
replica and asked again after the replica has left the rotation (a restart may change it).

The tokenizer needs it to choose how it adds a request: to an auto-stepping engine it sends the
request's state to the detokenizer and its children to the engine at once; to a manually
stepped one, in turn (a Step racing an add must find the request's state in the detokenizer, so
that the step's outputs are in the Step's answer)."""

from __future__ import annotations

import logging

import grpc

from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services.common.engine_replicas import EngineReplicas
from strand.services.common.stage_auth import stage_metadata

logger = logging.getLogger(__name__)

# A replica that does not answer GetInfo within this is taken as manual (the safe order).
INFO_TIMEOUT_S = 2.0


class EngineModes:
    def __init__(self, engines: EngineReplicas) -> None:
        self.engines = engines
        self._auto: dict[str, bool] = {}
        engines.listeners.append(self._on_rotation)

    async def auto_step(self, replica: str) -> bool:
        known = self._auto.get(replica)
        if known is not None:
            return known
        try:
            info = await self.engines.clients[replica].stub.GetInfo(
                epb.EngineInfoRequest(), timeout=INFO_TIMEOUT_S, metadata=stage_metadata(),
                wait_for_ready=True)  # the channel may be in back-off while the link is up
        except grpc.aio.AioRpcError as exc:
            # Not remembered: the add that follows reports the replica's trouble, and the
            # next one asks again.
            logger.info("engine %s did not say its mode (%s): adding in turn", replica,
                        exc.details() or exc.code().name)
            return False
        self._auto[replica] = bool(info.auto_step)
        return self._auto[replica]

    def _on_rotation(self, replica: str, in_rotation: bool) -> None:
        if not in_rotation:
            self._auto.pop(replica, None)
