"""The engine replicas a stage talks to (data parallelism): one StageClient each, keyed by the
replica's address, and which of them are in rotation.

A replica leaves the rotation the moment a call to it fails as UNAVAILABLE (or its readiness
check fails) and comes back when its grpc.health.v1 readiness says SERVING again. `fan_out`
sends one message to every replica in rotation and reports each one's answer or error, which
is how engine-wide calls (Step, reset, clear, lookup, loads) keep their meaning with N engines.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from strand.services._proto.strand.v1 import engine_pb2_grpc
from strand.services.common.readiness_watch import watch_readiness
from strand.services.common.stage_client import StageClient
from strand.services.common.status import StageError, StageUnavailable

logger = logging.getLogger(__name__)


def parse_engine_addresses(value: str, flag: str = "--engine-addr") -> list[str]:
    """`host:port,host:port` -> the list; ValueError naming the flag on a malformed entry."""
    addresses = [a.strip() for a in value.split(",") if a.strip()]
    if not addresses:
        raise ValueError(f"{flag} must name at least one host:port, got {value!r}")
    for address in addresses:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{flag} entries must be host:port with a port in "
                             f"[1, 65535], got {address!r}")
    if len(set(addresses)) != len(addresses):
        raise ValueError(f"{flag} entries must be distinct, got {value!r}")
    return addresses


class EngineReplicas:
    def __init__(self, clients: Sequence[StageClient]) -> None:
        if not clients:
            raise ValueError("clients must not be empty: a stage needs at least one engine")
        self.clients = {c.target: c for c in clients}
        self._in_rotation = set(self.clients)
        self._ever_up: set[str] = set()  # seen ready at least once: a later return is news
        # Told (replica, in_rotation) whenever a replica leaves or rejoins the rotation.
        self.listeners: list[Callable[[str, bool], None]] = []
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    def connect(cls, addresses: Sequence[str]) -> EngineReplicas:
        return cls([StageClient("engine", a, engine_pb2_grpc.EngineStub) for a in addresses])

    @property
    def names(self) -> list[str]:
        return list(self.clients)

    @property
    def first(self) -> StageClient:
        return next(iter(self.clients.values()))

    def in_rotation(self) -> list[str]:
        return [name for name in self.clients if name in self._in_rotation]

    @property
    def ready(self) -> bool:
        return bool(self._in_rotation)

    def start(self) -> None:
        """Follow each replica's readiness in the background (until close)."""
        # Until the first check, nothing is known to be up.
        for name in list(self._in_rotation):
            self._set(name, False, "not checked yet", quiet=True)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(watch_readiness(client.channel, partial(self._set, name)))
                       for name, client in self.clients.items()]

    def stop_watching(self) -> None:
        """Stop following readiness: for a stage that is stopping, whose replicas going away
        (the whole stack stopping) is no news to report."""
        for task in self._tasks:
            task.cancel()

    async def close(self) -> None:
        self.stop_watching()
        for client in self.clients.values():
            await client.close()

    async def call(self, name: str, msg: Any) -> Any:
        """One replica's answer; a replica found down leaves the rotation at once."""
        return await self._marking(name, self._client(name).call(msg))

    def send(self, name: str, msg: Any) -> Awaitable[Any]:
        """`call`, its frame written in this turn where it can be (StageClient.send)."""
        return self._marking(name, self._client(name).send(msg))

    def _client(self, name: str) -> StageClient:
        client = self.clients.get(name)
        if client is None:
            raise ValueError(f"engine must be one of {self.names}, got {name!r}")
        return client

    async def _marking(self, name: str, answer: Awaitable[Any]) -> Any:
        try:
            return await answer
        except StageUnavailable as exc:
            self._set(name, False, exc.message)
            raise

    async def fan_out(self, make_msg: Callable[[str], Any], names: Sequence[str] | None = None
                      ) -> dict[str, Any]:
        """make_msg(replica) to each replica (those in rotation unless `names`; all of them when
        none is, so a replica just back answers before its next health check, and the errors
        say why): per replica, its answer or the StageError it raised."""
        targets = list(names) if names is not None else (self.in_rotation() or self.names)
        results = await asyncio.gather(*(self.call(n, make_msg(n)) for n in targets),
                                       return_exceptions=True)
        out: dict[str, Any] = {}
        for name, result in zip(targets, results, strict=True):
            if isinstance(result, BaseException) and not isinstance(result, StageError):
                raise result
            out[name] = result
        return out

    def _set(self, name: str, up: bool, reason: str = "", quiet: bool = False) -> None:
        if (name in self._in_rotation) == up:
            return
        if up:
            self._in_rotation.add(name)
        else:
            self._in_rotation.discard(name)
        if not quiet:
            if up and name not in self._ever_up:
                logger.debug("engine replica %s is in rotation", name)  # the first check
            elif up:
                logger.info("engine replica %s is back in rotation", name)
            else:
                logger.warning("engine replica %s is out of rotation: %s", name, reason)
        if up:
            self._ever_up.add(name)
        for listener in self.listeners:
            listener(name, up)
