"""SubscribeKvEvents: the gateway's KV events (every engine replica's) as one stream numbered by
this front, kept in a bounded history so a subscriber resumes from `start_sequence_number`;
each batch carries the stack's load, and a load-only batch goes out while nothing happens."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
from smg_grpc_proto.generated import common_pb2 as cmn

from strand.services._proto.strand.v1 import control_pb2 as cpb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.vllm_grpc.admin import scheduler_load
from strand.services.vllm_grpc.link import GatewayLink

HISTORY = 4096  # batches kept for resuming subscribers
HEARTBEAT_S = 1.0  # a load-only batch after this long without events


def block_hash(digest: bytes) -> int:
    """Strand's block hash (a digest) as the int64 the protocol carries: its first 8 bytes."""
    return int.from_bytes(digest[:8], "big", signed=True)


def convert_batch(batch: pb.KvEventBatch, seq: int) -> cmn.KvEventBatch:
    out = cmn.KvEventBatch(sequence_number=seq, timestamp=batch.timestamp or time.time())
    for event in batch.events:
        kind = event.WhichOneof("kind")
        if kind == "block_stored" and event.block_stored.block_size > 0:
            # (A snapshot batch's hashes come without tokens or size: not expressible here, its
            # AllBlocksCleared is.)
            stored = event.block_stored
            size = int(stored.block_size)
            msg = cmn.KvBlocksStored(tier=cmn.KV_CACHE_TIER_DEVICE,
                                     locality=cmn.KV_CACHE_LOCALITY_LOCAL)
            if stored.HasField("parent_block_hash"):
                msg.parent_block_hash = block_hash(stored.parent_block_hash)
            for i, digest in enumerate(stored.block_hashes):
                msg.blocks.add(block_hash=block_hash(digest), block_size=size,
                               token_ids=stored.token_ids[i * size:(i + 1) * size])
            out.events.add(stored=msg)
        elif kind == "block_removed":
            out.events.add(removed=cmn.KvBlocksRemoved(
                block_hashes=[block_hash(d) for d in event.block_removed.block_hashes],
                tier=cmn.KV_CACHE_TIER_DEVICE))
        elif kind == "all_blocks_cleared":
            out.events.add(cleared=cmn.KvCacheCleared())
    return out


class KvEventRelay:
    """One subscription to the gateway, shared by every subscriber of this front."""

    def __init__(self, link: GatewayLink) -> None:
        self.link = link
        self.history: collections.deque[cmn.KvEventBatch] = collections.deque(maxlen=HISTORY)
        self.last_seq = 0
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._error: grpc.RpcError | None = None
        self._sample = 0

    async def subscribe(self, start_seq: int, load_first: bool) -> AsyncIterator[cmn.KvEventBatch]:
        self._ensure_running()
        if load_first:
            yield await self._load_only(0)
        sent = start_seq - 1 if start_seq > 0 else self.last_seq
        while True:
            for batch in [b for b in self.history if b.sequence_number > sent]:
                sent = batch.sequence_number
                yield batch
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), HEARTBEAT_S)
            if self.last_seq <= sent and self._error is None:
                yield await self._load_only(sent)

    def _ensure_running(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._relay())

    async def _relay(self) -> None:
        try:
            async for batch in self.link.kv_stream(cpb.SubscribeKvEventsRequest()):
                self.last_seq += 1
                converted = convert_batch(batch, self.last_seq)
                self.history.append(converted)
                async with self._changed:
                    self._changed.notify_all()
        except grpc.RpcError as exc:
            self._error = exc
            async with self._changed:
                self._changed.notify_all()

    async def _load_only(self, seq: int) -> cmn.KvEventBatch:
        self._sample += 1
        record = cmn.EngineLoad(load_only=True, sample=self._sample)
        try:
            loads = (await self.link.control_call("GetLoads", cpb.GetLoadsRequest(),
                                                  timeout=5.0)).loads
        except grpc.RpcError:
            loads = []
        load = scheduler_load(loads)
        record.running_requests = load.num_running_reqs
        record.waiting_requests = load.num_waiting_reqs
        record.token_usage = load.token_usage
        record.cache_hit_rate = load.cache_hit_rate
        return cmn.KvEventBatch(sequence_number=seq, timestamp=time.time(), load=record)
