"""Readiness of the stages a stage depends on, from their grpc.health.v1 "readiness" status,
watched in the background (readiness_watch): a stage is ready when every stage it sends to is."""

from __future__ import annotations

import asyncio
from functools import partial

import grpc

from strand.services.common.readiness_watch import watch_readiness


class PeerHealth:
    def __init__(self, channels: dict[str, grpc.aio.Channel]) -> None:
        self._channels = channels
        self.status: dict[str, bool] = dict.fromkeys(channels, False)
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def ready(self) -> bool:
        return all(self.status.values())

    def not_ready(self) -> list[str]:
        return [name for name, ok in self.status.items() if not ok]

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(watch_readiness(channel, partial(self._set, name)))
                       for name, channel in self._channels.items()]

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    def _set(self, name: str, ready: bool, reason: str) -> None:
        self.status[name] = ready
