"""Fan-out to engine replicas without a network: a replica that fails leaves the rotation at
once and is reported with its error, the aggregates read as one engine's answer, bad input
fails the whole call, and the tokenizer's router follows snapshots, gaps, resumes, restarts
(a new epoch) and the rotation."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.engine_replicas import EngineReplicas, parse_engine_addresses
from strand.services.common.status import StageError, StageUnavailable
from strand.services.common.subscriber import Resubscribe
from strand.services.gateway.replica_reports import cleared_report, lookup_report, reset_report
from strand.services.router import prompt_block_hashes
from strand.services.tokenizer.routing import KvEventsSubscription, ReplicaRouter

BLOCK_SIZE = 4


class FakeEngine:
    def __init__(self, target: str, answer: Any) -> None:
        self.target = target
        self.channel: Any = None
        self.answer = answer
        self.sent: list[Any] = []

    async def call(self, msg: Any) -> Any:
        self.sent.append(msg)
        if isinstance(self.answer, StageError):
            raise self.answer
        return self.answer

    async def close(self) -> None:
        pass


def _state(reset_ok: bool, num_blocks: int) -> epb.EngineResponse:
    return epb.EngineResponse(state=epb.EngineState(reset_ok=reset_ok, tiers=[
        pb.TierReset(tier="device", reset=reset_ok, num_blocks=num_blocks)]))


def test_engine_addresses_are_parsed_and_bad_ones_name_the_flag() -> None:
    assert parse_engine_addresses("a:1, b:2") == ["a:1", "b:2"]
    for bad, words in (("", "at least one"), ("a", "host:port"), ("a:0", "[1, 65535]"),
                       ("a:1,a:1", "distinct")):
        with pytest.raises(ValueError, match="--engine-addresses") as err:
            parse_engine_addresses(bad, "--engine-addresses")
        assert words in str(err.value)


def test_a_replica_that_fails_leaves_the_rotation_and_is_reported_with_its_error() -> None:
    up = FakeEngine("a:1", _state(True, 3))
    down = FakeEngine("b:1", StageUnavailable("engine", "cannot connect to b:1"))
    engines = EngineReplicas([up, down])  # type: ignore[list-item]
    told: list[tuple[str, bool]] = []
    engines.listeners.append(lambda name, ok: told.append((name, ok)))
    report = reset_report(asyncio.run(engines.fan_out(
        lambda _: epb.EngineRequest(reset_prefix_cache=epb.EngineResetPrefixCache()))))
    assert report.success is False
    assert [(r.engine, r.success, r.error) for r in report.replicas] == [
        ("a:1", True, ""), ("b:1", False, "engine stage is unavailable: cannot connect to b:1")]
    assert engines.in_rotation() == ["a:1"] and told == [("b:1", False)]
    asyncio.run(engines.fan_out(lambda _: epb.EngineRequest(query=epb.EngineQuery())))
    assert len(down.sent) == 1  # not asked again while out of rotation


def test_reset_report_sums_tiers_and_succeeds_only_when_every_replica_did() -> None:
    report = reset_report({"a:1": _state(True, 3), "b:1": _state(True, 5)})
    assert report.success and [(t.tier, t.num_blocks) for t in report.tiers] == [("device", 8)]
    assert reset_report({"a:1": _state(True, 3), "b:1": _state(False, 0)}).success is False


def test_bad_input_fails_the_whole_call_and_no_answer_is_unavailable() -> None:
    bad = StageError(grpc.StatusCode.INVALID_ARGUMENT, "location must be device or cpu")
    with pytest.raises(StageError) as err:
        cleared_report({"a:1": bad, "b:1": bad})
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    gone = StageUnavailable("engine", "x")
    with pytest.raises(StageError) as err:
        lookup_report({"a:1": gone, "b:1": gone})
    assert err.value.code == grpc.StatusCode.UNAVAILABLE


def test_clear_and_lookup_aggregate_as_one_engine() -> None:
    cleared = cleared_report({
        "a:1": epb.EngineResponse(cleared=epb.KvCacheCleared(event_id="e1",
                                                             num_tokens_cleared=16)),
        "b:1": epb.EngineResponse(cleared=epb.KvCacheCleared(event_id="e2",
                                                             num_tokens_cleared=32))})
    assert (cleared.event_id, cleared.num_tokens_cleared) == ("e1,e2", 48)
    found = lookup_report({
        "a:1": epb.EngineResponse(lookup=epb.KvCacheLookup(num_cached_tokens={"device": 16})),
        "b:1": epb.EngineResponse(lookup=epb.KvCacheLookup(num_cached_tokens={"device": 32}))})
    assert dict(found.num_cached_tokens) == {"device": 32}
    assert [dict(r.num_cached_tokens) for r in found.replicas] == [{"device": 16},
                                                                    {"device": 32}]


def _router() -> tuple[EngineReplicas, ReplicaRouter]:
    engines = EngineReplicas([FakeEngine("a:1", None), FakeEngine("b:1", None)])  # type: ignore[list-item]
    return engines, ReplicaRouter(engines, BLOCK_SIZE)


def test_router_sends_a_prompt_to_the_replica_whose_snapshot_caches_its_prefix() -> None:
    engines, router = _router()
    prompt = list(range(10, 10 + 3 * BLOCK_SIZE))
    sub = KvEventsSubscription(engines, "b:1", router.router)
    sub.on_subscribed(epb.EngineKvEvents(
        subscribed=True, snapshot_block_hashes=prompt_block_hashes(prompt, BLOCK_SIZE),
        snapshot_next_seq=7))
    assert router.policy == "kv-aware"
    assert router.route(prompt) == "b:1"


def test_router_skips_a_replica_out_of_rotation_and_is_unavailable_with_none() -> None:
    engines, router = _router()
    router._on_rotation("a:1", False)
    assert {router.route([i] * BLOCK_SIZE) for i in range(3)} == {"b:1"}
    router._on_rotation("b:1", False)
    with pytest.raises(StageUnavailable, match="no engine replica is in rotation"):
        router.route([1] * BLOCK_SIZE)


def test_a_sequence_gap_reopens_the_kv_subscription_for_a_fresh_snapshot() -> None:
    engines, router = _router()
    sub = KvEventsSubscription(engines, "a:1", router.router)
    router._subscriptions["a:1"] = sub
    sub.on_subscribed(epb.EngineKvEvents(subscribed=True, snapshot_next_seq=3))
    asyncio.run(sub.on_message(epb.EngineKvEvents(batch=pb.KvEventBatch(seq=3))))
    with pytest.raises(Resubscribe):
        asyncio.run(sub.on_message(epb.EngineKvEvents(batch=pb.KvEventBatch(seq=5))))


def test_a_reopened_kv_subscription_resumes_and_keeps_its_mirror() -> None:
    engines, router = _router()
    prompt = list(range(10, 10 + 2 * BLOCK_SIZE))
    hashes = prompt_block_hashes(prompt, BLOCK_SIZE)
    sub = KvEventsSubscription(engines, "a:1", router.router)
    assert not sub.request().HasField("start_seq")  # nothing mirrored yet: a snapshot
    sub.on_subscribed(epb.EngineKvEvents(subscribed=True, snapshot_block_hashes=hashes,
                                         snapshot_next_seq=3, epoch="e1"))
    asyncio.run(sub.on_message(epb.EngineKvEvents(batch=pb.KvEventBatch(seq=3, epoch="e1"))))
    assert sub.request() == epb.EngineKvEventsRequest(start_seq=4, epoch="e1")
    sub.on_subscribed(epb.EngineKvEvents(subscribed=True, resumed=True, epoch="e1",
                                         snapshot_next_seq=4))
    assert router.router.index.blocks("a:1") == set(hashes)


def test_a_restarted_replicas_new_epoch_replaces_its_mirror_and_routing_follows() -> None:
    engines, router = _router()
    prompt = list(range(10, 10 + 3 * BLOCK_SIZE))
    hashes = prompt_block_hashes(prompt, BLOCK_SIZE)
    subs = {name: KvEventsSubscription(engines, name, router.router) for name in ("a:1", "b:1")}
    subs["b:1"].on_subscribed(epb.EngineKvEvents(subscribed=True, snapshot_block_hashes=hashes,
                                                 snapshot_next_seq=9, epoch="old"))
    subs["a:1"].on_subscribed(epb.EngineKvEvents(subscribed=True, snapshot_block_hashes=hashes[:1],
                                                 epoch="a"))
    assert router.route(prompt) == "b:1"
    # b:1 restarted: its resume point names the old epoch, and it answers with a new snapshot.
    assert subs["b:1"].request().epoch == "old"
    subs["b:1"].on_subscribed(epb.EngineKvEvents(subscribed=True, epoch="new"))
    assert router.router.index.blocks("b:1") == set()
    assert router.router.index.resume_point("b:1") == (0, "new")
    assert router.route(prompt) == "a:1"


def test_an_add_not_yet_answered_counts_against_its_replica_despite_an_older_load_poll() -> None:
    engines, router = _router()
    router.policy = router.router.policy = "least-load"
    first = router.route([1] * BLOCK_SIZE)
    # A poll answered before the add reached the engine: it cannot count it yet.
    router.update_load(first, pb.EngineLoad())
    assert router.router.loads[first].waiting == 1
    assert router.route([2] * BLOCK_SIZE) != first
    router.answered(first)
    router.update_load(first, pb.EngineLoad(num_waiting=1))  # the engine has it now
    assert router.router.loads[first].waiting == 1


def test_a_stopping_stage_stops_following_its_replicas_readiness() -> None:
    # A stage stopping beside its engines (`strand serve`'s stop) saw them go and warned that
    # each was out of rotation; stop_watching is its first step, before the calls' grace.
    async def run() -> list[asyncio.Task[None]]:
        engines = EngineReplicas.connect(["127.0.0.1:1"])  # nothing listens there
        engines.start()
        watchers = list(engines._tasks)
        engines.stop_watching()
        await asyncio.sleep(0.05)
        await engines.close()
        return watchers

    watchers = asyncio.run(run())
    assert watchers and all(t.cancelled() for t in watchers)
