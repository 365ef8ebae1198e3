"""The tokenizer's router: which engine replica each request goes to.

The tokenizer is where a request's token ids are first known, so the router lives here
(SGLang's and llm-d's placement). It keeps strand.services.router's Router fed with:
- each replica's KV events (Engine.KvEvents: a snapshot of the cached hashes, then every
  batch; a sequence gap makes the index resync, and the subscription is reopened for a fresh
  snapshot; a stream reopened otherwise resumes from the seq the index expects, and a replica
  that restarted answers with its new epoch's snapshot), when the policy is kv-aware;
- each replica's load (Engine get_loads, polled), when the policy weighs load, plus the adds
  routed to it that it has not answered yet (a poll answered before them cannot count them,
  and they travel on the same stream, so nothing is counted twice or missed);
- the rotation (EngineReplicas): a replica found down is removed at once, and added back, its
  KV subscription reopened, when its readiness returns.
With one engine there is nothing to choose and none of this runs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.convert_kv_events import kv_event_batch_from_pb
from strand.services.common.engine_replicas import EngineReplicas
from strand.services.common.status import StageError, StageUnavailable
from strand.services.common.subscriber import Resubscribe, Subscriber
from strand.services.router import ReplicaLoad, Router

logger = logging.getLogger(__name__)

LOAD_POLL_S = 0.2


class KvEventsSubscription(Subscriber):
    """One replica's KV events into the router's index."""

    not_subscribed = "no KV events subscription"

    def __init__(self, engines: EngineReplicas, replica: str, router: Router) -> None:
        super().__init__(engines.clients[replica])
        self.replica = replica
        self.router = router
        self._resync_reason = ""
        self._warned = False  # about an engine without --kv-events, once

    method = "KvEvents"

    def request(self) -> epb.EngineKvEventsRequest:
        resume = self.router.index.resume_point(self.replica)
        if resume is None:
            return epb.EngineKvEventsRequest()
        return epb.EngineKvEventsRequest(start_seq=resume[0], epoch=resume[1])

    def on_subscribed(self, msg: epb.EngineKvEvents) -> None:
        if msg.resumed:
            return  # the mirror stands; the missed batches follow
        self.router.index.load_snapshot(self.replica, list(msg.snapshot_block_hashes),
                                        msg.snapshot_next_seq, msg.epoch)

    async def on_message(self, msg: epb.EngineKvEvents) -> None:
        self.router.apply_events(self.replica, kv_event_batch_from_pb(msg.batch))
        if self._resync_reason:
            reason, self._resync_reason = self._resync_reason, ""
            raise Resubscribe(reason)

    def resync(self, reason: str) -> None:
        """The index lost track of this replica: the next message reopens the stream."""
        self._resync_reason = reason

    def on_lost(self, detail: str, was_subscribed: bool) -> None:
        if detail.startswith("FAILED_PRECONDITION") and not self._warned:
            self._warned = True
            logger.warning("engine %s records no KV events (start it with --kv-events): the "
                           "router only remembers where it sent each prefix", self.replica)
        elif was_subscribed and not detail.startswith("resubscribing"):
            logger.info("KV events of %s: %s", self.replica, detail)


class ReplicaRouter:
    def __init__(self, engines: EngineReplicas, block_size: int, policy: str | None = None,
                 hash_algo: str = "sha256") -> None:
        self.engines = engines
        self.router = Router(engines.names, block_size, policy, hash_algo,
                             on_resync=self._on_resync)
        self.policy = self.router.policy
        self._subscriptions: dict[str, KvEventsSubscription] = {}
        self._in_flight: dict[str, int] = {}  # routed adds the replica has not answered yet
        self._load_task: asyncio.Task[None] | None = None
        engines.listeners.append(self._on_rotation)

    @property
    def _single(self) -> bool:
        return len(self.engines.names) == 1

    def start(self) -> None:
        if self._single:
            return
        if self.policy == "kv-aware":
            for name in self.engines.names:
                sub = KvEventsSubscription(self.engines, name, self.router)
                self._subscriptions[name] = sub
                sub.start()
        if self.policy != "round-robin":
            self._load_task = asyncio.get_running_loop().create_task(self._poll_loads())

    async def close(self) -> None:
        for sub in self._subscriptions.values():
            await sub.close()
        if self._load_task is not None:
            self._load_task.cancel()

    def route(self, token_ids: Sequence[int], cache_salt: str | None = None,
              lora_int_id: int | None = None) -> str:
        """The replica for a prompt run with adapter lora_int_id (None: the base model);
        UNAVAILABLE naming the engine when none is in rotation."""
        if self._single:
            return self.engines.names[0]  # its own errors say whether it is up
        try:
            replica = self.router.route(token_ids, cache_salt, lora_int_id)
        except ValueError as exc:
            raise StageUnavailable("engine", "no engine replica is in rotation") from exc
        self._in_flight[replica] = self._in_flight.get(replica, 0) + 1
        return replica

    def answered(self, replica: str) -> None:
        """The replica answered the add routed to it (taken or refused)."""
        if self._in_flight.get(replica, 0) > 0:
            self._in_flight[replica] -= 1

    def _on_rotation(self, replica: str, in_rotation: bool) -> None:
        if not in_rotation:
            self.router.remove_replica(replica)
            return
        self.router.add_replica(replica)
        sub = self._subscriptions.get(replica)
        if sub is not None:
            # What it caches now may differ from what the index last saw: a fresh snapshot.
            asyncio.get_running_loop().create_task(self._restart(sub))

    async def _restart(self, sub: KvEventsSubscription) -> None:
        await sub.close()
        sub.start()

    def _on_resync(self, replica: str) -> None:
        sub = self._subscriptions.get(replica)
        if sub is not None:
            sub.resync("the KV event sequence had a gap or the cache was cleared")

    def update_load(self, replica: str, load: pb.EngineLoad) -> None:
        """A polled load, plus the adds routed to the replica that it has not answered."""
        self.router.update_load(replica, ReplicaLoad(
            running=int(load.num_running),
            waiting=int(load.num_waiting) + self._in_flight.get(replica, 0),
            free_blocks=int(load.kv_blocks_free),
            total_blocks=int(load.kv_blocks_used + load.kv_blocks_free)))

    async def _poll_loads(self) -> None:
        while True:
            for name in self.engines.in_rotation():
                try:
                    resp = await self.engines.call(name, epb.EngineRequest(
                        get_loads=epb.EngineGetLoads()))
                except StageError:
                    continue  # out of rotation now; its health check brings it back
                self.update_load(name, resp.load)
            await asyncio.sleep(LOAD_POLL_S)
