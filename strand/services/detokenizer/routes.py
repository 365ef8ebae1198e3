"""Which gateway (origin) owns each request here, which engine replica runs it, and each
gateway's outgoing queue."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from strand.services._proto.strand.v1 import detokenizer_pb2 as dpb
from strand.services._proto.strand.v1 import types_pb2 as pb


class Routes:
    def __init__(self) -> None:
        self._queues: dict[str, asyncio.Queue[dpb.OutputBatch | None]] = {}
        self._origin: dict[str, str] = {}  # request id -> origin
        self._engine: dict[str, str] = {}  # request id -> the engine replica running it

    def subscribe(self, origin: str) -> asyncio.Queue[dpb.OutputBatch | None]:
        old = self._queues.get(origin)
        if old is not None:
            old.put_nowait(None)  # one subscription per gateway: the newer wins
        queue: asyncio.Queue[dpb.OutputBatch | None] = asyncio.Queue()
        self._queues[origin] = queue
        return queue

    def unsubscribe(self, origin: str, queue: asyncio.Queue[dpb.OutputBatch | None]
                    ) -> list[str]:
        """End the subscription; the ids its gateway owned (no longer its: abort them, which
        forgets their engine too)."""
        if self._queues.get(origin) is not queue:
            return []  # replaced by a newer subscription of the same gateway
        del self._queues[origin]
        owned = [r for r, o in self._origin.items() if o == origin]
        for request_id in owned:
            del self._origin[request_id]
        return owned

    def is_subscribed(self, origin: str) -> bool:
        return origin in self._queues

    def own(self, request_id: str, origin: str, engine: str = "") -> None:
        self._origin[request_id] = origin
        self._engine[request_id] = engine

    def forget(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._origin.pop(request_id, None)
            self._engine.pop(request_id, None)

    def owned(self, engine: str | None = None) -> list[str]:
        """Every request here, or those running on one engine replica."""
        if engine is None:
            return list(self._origin)
        return [r for r, e in self._engine.items() if e == engine]

    def engine_of(self, request_id: str) -> str | None:
        return self._engine.get(request_id)

    def send(self, outputs: list[pb.RequestOutput], step_id: int = 0, step_origin: str = ""
             ) -> None:
        """Each output to its gateway; the gateway whose Step ran the step gets a batch tagged
        with step_id even when none of the outputs are its own (its Step call waits for it)."""
        by_origin: dict[str, list[pb.RequestOutput]] = {}
        for output in outputs:
            origin = self._origin.get(output.request_id)
            if origin is None:
                continue
            by_origin.setdefault(origin, []).append(output)
            if output.finished:
                del self._origin[output.request_id]
                self._engine.pop(output.request_id, None)
        if step_id and step_origin not in by_origin:
            by_origin[step_origin] = []
        for origin, batch in by_origin.items():
            queue = self._queues.get(origin)
            if queue is not None:
                tag = step_id if origin == step_origin else 0
                queue.put_nowait(dpb.OutputBatch(step_id=tag, outputs=batch))
