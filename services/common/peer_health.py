"""Readiness of the stages a stage depends on, from their grpc.health.v1 "readiness" status,
polled in the background: a stage is ready when every stage it sends to is."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.server import READINESS

POLL_S = 0.25


class PeerHealth:
    def __init__(self, channels: dict[str, grpc.aio.Channel]) -> None:
        self._stubs = {name: health_pb2_grpc.HealthStub(ch) for name, ch in channels.items()}
        self.status: dict[str, bool] = dict.fromkeys(channels, False)
        self._task: asyncio.Task[None] | None = None

    @property
    def ready(self) -> bool:
        return all(self.status.values())

    def not_ready(self) -> list[str]:
        return [name for name, ok in self.status.items() if not ok]

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._poll())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _poll(self) -> None:
        serving = health_pb2.HealthCheckResponse.SERVING
        while True:
            for name, stub in self._stubs.items():
                ok = False
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.TimeoutError):
                    resp = await stub.Check(health_pb2.HealthCheckRequest(service=READINESS),
                                            timeout=1.0)
                    ok = resp.status == serving
                self.status[name] = ok
            await asyncio.sleep(POLL_S)
