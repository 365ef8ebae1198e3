"""reset_prefix_cache per tier: what the device cache and each connector tier dropped, and no
blocks copied into a tier that the same reset empties."""

from __future__ import annotations

from strand.engine_core.connector.multi import MultiConnector
from strand.engine_core.core.tier_reset import TierReset
from tests.engine_core.connector.conftest import DictTierConnector, RecordingConnector
from tests.engine_core.core.conftest import (
    FakeRunner,
    make_request,
    make_scheduler,
    run_to_completion,
    step,
)

SHARED = list(range(200, 212))  # three blocks of 4


def test_device_tier_reports_the_cached_blocks_it_dropped() -> None:
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", SHARED + [1], max_tokens=1))
    run_to_completion(scheduler)
    assert scheduler.reset_prefix_cache_tiers() == [TierReset("device", True, 3)]
    assert scheduler.reset_prefix_cache_tiers() == [TierReset("device", True, 0)]


def test_refused_device_reset_reports_nothing_dropped() -> None:
    scheduler = make_scheduler()
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("live", SHARED + [1], max_tokens=50))
    step(scheduler, runner)
    assert scheduler.reset_prefix_cache_tiers() == [TierReset("device", False, 0)]
    assert scheduler.reset_prefix_cache() is False


def test_each_connector_child_is_a_tier_of_its_own() -> None:
    ok, failing = RecordingConnector(reset_answer=True), RecordingConnector(reset_answer=False)
    multi = MultiConnector([ok, failing])
    scheduler = make_scheduler(connector=multi)
    tiers = scheduler.reset_prefix_cache_tiers(reset_connector=True)
    assert [(t.tier, t.reset) for t in tiers] == [
        ("device", True), ("RecordingConnector", True), ("RecordingConnector", False)]
    assert scheduler.reset_prefix_cache(reset_connector=True) is False


def test_resetting_running_requests_and_the_connector_copies_nothing_into_it() -> None:
    tier = DictTierConnector(FakeRunner(make_scheduler()))
    scheduler = make_scheduler(connector=tier)
    runner = FakeRunner(scheduler)
    tier.runner = runner  # the tier reads the cache of the runner that steps this scheduler
    scheduler.add_request(make_request("live", SHARED + [1], max_tokens=50))
    step(scheduler, runner)
    saved: list[str] = []
    original = tier.request_finished
    tier.request_finished = lambda r, b: (saved.append(r.request_id), original(r, b))[1]  # type: ignore[method-assign,assignment,func-returns-value]
    tiers = scheduler.reset_prefix_cache_tiers(reset_running_requests=True,
                                               reset_connector=True)
    assert saved == []  # the preempted request's blocks were not offered to the tier
    assert [t.tier for t in tiers] == ["device", "DictTierConnector"]
    assert all(t.reset for t in tiers)
    # Without reset_connector the preempted blocks are offered as usual.
    step(scheduler, runner)
    scheduler.reset_prefix_cache_tiers(reset_running_requests=True)
    assert saved == ["live"]
