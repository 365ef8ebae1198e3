"""clear_location / lookup_locations on a scheduler: device and cpu, without a model."""

from __future__ import annotations

import pytest

from strand.engine_core.core import kv_control
from tests.engine_core.core.conftest import (
    FakeRunner,
    make_request,
    make_scheduler,
    run_to_completion,
    step,
)

SHARED = list(range(200, 212))  # three blocks of 4


def test_clear_device_forgets_only_free_blocks_and_keeps_running_ones() -> None:
    scheduler = make_scheduler()
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("done", SHARED + [1], max_tokens=1))
    run_to_completion(scheduler, runner)
    scheduler.add_request(make_request("live", list(range(300, 309)), max_tokens=50))
    step(scheduler, runner)  # "live" holds two full cached blocks
    assert kv_control.clear_location(scheduler, "device") == 12
    assert kv_control.lookup_locations(scheduler, SHARED)["device"] == 0
    assert kv_control.lookup_locations(scheduler, list(range(300, 309)))["device"] == 8


def test_cleared_blocks_are_reused_first() -> None:
    scheduler = make_scheduler(num_blocks=8)
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("a", SHARED + [1], max_tokens=1))
    run_to_completion(scheduler, runner)
    kv_control.clear_location(scheduler, "device")
    pool = scheduler.kv_cache_manager.block_pool
    free = pool.free_block_queue.get_all_free_blocks()
    assert all(b.block_hash is None for b in free)
    assert pool.cached_block_hash_to_block == {}


def test_lookup_reports_zero_everywhere_when_prefix_caching_is_off() -> None:
    scheduler = make_scheduler(enable_prefix_caching=False)
    scheduler.add_request(make_request("a", SHARED + [1], max_tokens=1))
    run_to_completion(scheduler)
    assert kv_control.lookup_locations(scheduler, SHARED) == {"device": 0, "cpu": 0}


def test_lookup_ignores_a_trailing_partial_block() -> None:
    scheduler = make_scheduler()
    scheduler.add_request(make_request("a", SHARED + [1], max_tokens=1))
    run_to_completion(scheduler)
    assert kv_control.lookup_locations(scheduler, SHARED + [1, 2]) == {"device": 12, "cpu": 0}


def test_an_unknown_location_is_rejected() -> None:
    with pytest.raises(ValueError, match="location must be one of"):
        kv_control.clear_location(make_scheduler(), "gpu")
