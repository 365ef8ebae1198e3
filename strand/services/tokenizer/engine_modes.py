"""Whether each engine replica steps itself (auto mode), as its GetInfo says, asked once per
replica and asked again after the replica has left the rotation (a restart may change it).

The tokenizer needs it to choose how it adds a request: to an auto-stepping engine it sends the
request's state to the detokenizer and its children to the engine at once; to a manually
stepped one, in turn (a Step racing an add must find the request's state in the detokenizer, so
that the step's outputs are in the Step's answer)."""

from __future__ import annotations

import asyncio
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
        # The GetInfo under way per replica: the adds that need the mode meanwhile (a burst
        # after a start: hundreds) share it instead of asking one each, which loaded the
        # engine and the tokenizer and held every add of the burst 30-130 ms.
        self._asking: dict[str, asyncio.Task[bool]] = {}
        engines.listeners.append(self._on_rotation)

    async def auto_step(self, replica: str) -> bool:
        known = self._auto.get(replica)
        if known is not None:
            return known
        asking = self._asking.get(replica)
        if asking is None:
            asking = asyncio.get_running_loop().create_task(self._ask(replica))
            self._asking[replica] = asking
            asking.add_done_callback(lambda task: self._asked(replica, task))
        # Shielded: an add that gives up does not take the others' answer with it.
        return await asyncio.shield(asking)

    def _asked(self, replica: str, task: asyncio.Task[bool]) -> None:
        if self._asking.get(replica) is task:
            del self._asking[replica]
        if not task.cancelled():
            task.exception()  # retrieved: a task whose waiters all left logs nothing

    async def _ask(self, replica: str) -> bool:
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
        auto = bool(info.auto_step)
        if self._asking.get(replica) is asyncio.current_task():
            self._auto[replica] = auto  # not when the replica left the rotation meanwhile
        return auto

    def _on_rotation(self, replica: str, in_rotation: bool) -> None:
        if not in_rotation:
            self._auto.pop(replica, None)
            # An answer under way may be from before the restart: the next add asks afresh.
            self._asking.pop(replica, None)
