"""The scheduler's connector hooks, over the fake runner whose fake KV cache checks every slot.

A block the tier loads must hold exactly what recomputing it would have written, or the fake
runner fails the step.
"""

from __future__ import annotations

from strand.engine_core.core.kv_cache_utils import update_block_hashes
from strand.engine_core.core.sched_output import SchedulerOutput
from strand.engine_core.core.scheduler import Scheduler
from tests.engine_core.connector.conftest import DictTierConnector
from tests.engine_core.core.conftest import (
    FakeRunner,
    RunResult,
    assert_pool_whole,
    check_invariants,
    expected_tokens,
    make_request,
    make_scheduler,
)

SHARED = list(range(100, 112))  # three blocks of 4


def _with_tier(num_blocks: int = 64, **kwargs: object) -> tuple[Scheduler, FakeRunner,
                                                                   DictTierConnector]:
    scheduler = make_scheduler(num_blocks=num_blocks, **kwargs)  # type: ignore[arg-type]
    runner = FakeRunner(scheduler)
    connector = DictTierConnector(runner)
    scheduler.connector = scheduler.kv_connector = connector
    return scheduler, runner, connector


def _run(scheduler: Scheduler, runner: FakeRunner, connector: DictTierConnector,
         result: RunResult | None = None) -> tuple[RunResult, list[SchedulerOutput]]:
    result = result or RunResult()
    schedules: list[SchedulerOutput] = []
    for _ in range(1000):
        if not scheduler.has_unfinished_requests():
            return result, schedules
        out = scheduler.schedule()
        schedules.append(out)
        if out.kv_connector_metadata is not None:
            connector.start_load_kv(out.kv_connector_metadata, [])
        result.collect(scheduler.update_from_output(out, runner.execute(out)))
        check_invariants(scheduler)
    raise AssertionError("not finished after 1000 steps")


def _evict_everything(scheduler: Scheduler) -> None:
    """Forget the device prefix cache, as eviction by other requests would."""
    assert scheduler.kv_cache_manager.block_pool.evict_cached_free_blocks() > 0


def test_a_finished_requests_computed_blocks_are_saved_by_hash() -> None:
    scheduler, runner, connector = _with_tier()
    request = make_request("a", SHARED + [1, 2], max_tokens=3)
    scheduler.add_request(request)
    _run(scheduler, runner, connector)
    # 14 prompt + 2 fed-back outputs = 16 computed tokens: four full blocks.
    assert list(connector.store) == request.block_hashes[:4]


def test_a_prompt_evicted_from_the_pool_is_loaded_from_the_tier() -> None:
    scheduler, runner, connector = _with_tier()
    scheduler.add_request(make_request("a", SHARED + [1], max_tokens=2))
    _run(scheduler, runner, connector)
    _evict_everything(scheduler)
    scheduler.add_request(make_request("b", SHARED + [2], max_tokens=2))
    result, schedules = _run(scheduler, runner, connector)
    first = schedules[0]
    assert first.scheduled_new_reqs[0].num_computed_tokens == 12
    assert first.num_scheduled_tokens == {"b": 1}
    assert connector.num_loaded_blocks == 3
    assert result.outputs[0].num_cached_tokens == 12
    assert result.tokens["b"] == expected_tokens(SHARED + [2], 2)


def test_the_last_prompt_token_is_computed_even_when_the_tier_holds_every_block() -> None:
    scheduler, runner, connector = _with_tier()
    scheduler.add_request(make_request("a", SHARED, max_tokens=2))
    _run(scheduler, runner, connector)
    _evict_everything(scheduler)
    scheduler.add_request(make_request("b", SHARED, max_tokens=2))
    result, schedules = _run(scheduler, runner, connector)
    # External hits are tokens: the tier supplies 11 of the 12, only the last is computed.
    assert schedules[0].num_scheduled_tokens == {"b": 1}
    assert schedules[0].scheduled_new_reqs[0].num_computed_tokens == 11
    assert connector.num_loaded_blocks == 3
    assert result.tokens["b"] == expected_tokens(SHARED, 2)


def test_tier_blocks_extend_a_shorter_device_hit() -> None:
    scheduler, runner, connector = _with_tier()
    scheduler.add_request(make_request("a", SHARED + [1], max_tokens=2))
    _run(scheduler, runner, connector)
    pool = scheduler.kv_cache_manager.block_pool
    second = pool.get_cached_block(_hash_of(scheduler, 1))
    assert second is not None
    pool._evict(second)  # only the second block is gone from the device
    scheduler.add_request(make_request("b", SHARED + [2], max_tokens=2))
    result, schedules = _run(scheduler, runner, connector)
    assert schedules[0].scheduled_new_reqs[0].num_computed_tokens == 12
    assert connector.num_loaded_blocks == 2  # blocks 1 and 2: block 0 was a device hit
    assert result.tokens["b"] == expected_tokens(SHARED + [2], 2)


def _hash_of(scheduler: Scheduler, block_index: int) -> bytes:
    probe = make_request("probe", SHARED + [1], max_tokens=1)
    update_block_hashes(probe, scheduler.block_size, scheduler.hash_fn)
    return probe.block_hashes[block_index]


def test_loaded_blocks_become_device_prefix_hits_for_later_requests() -> None:
    scheduler, runner, connector = _with_tier()
    scheduler.add_request(make_request("a", SHARED + [1], max_tokens=2))
    _run(scheduler, runner, connector)
    _evict_everything(scheduler)
    scheduler.add_request(make_request("b", SHARED + [2], max_tokens=2))
    _run(scheduler, runner, connector)
    connector.store.clear()
    scheduler.add_request(make_request("c", SHARED + [3], max_tokens=2))
    result, schedules = _run(scheduler, runner, connector)
    assert schedules[0].scheduled_new_reqs[0].num_computed_tokens == 12
    assert connector.num_loaded_blocks == 3  # all from b's load: c hit on the device
    assert result.tokens["c"] == expected_tokens(SHARED + [3], 2)


def test_external_hits_are_counted_and_reset_with_the_prefix_cache() -> None:
    scheduler, runner, connector = _with_tier()
    scheduler.add_request(make_request("a", SHARED + [1], max_tokens=2))
    _run(scheduler, runner, connector)
    _evict_everything(scheduler)
    scheduler.add_request(make_request("b", SHARED + [2], max_tokens=2))
    _run(scheduler, runner, connector)
    stats = scheduler.make_stats().connector_prefix_cache_stats
    assert stats is not None
    assert (stats.requests, stats.queries, stats.hits) == (2, 26, 12)
    assert scheduler.reset_prefix_cache(reset_connector=True) is True
    stats = scheduler.make_stats().connector_prefix_cache_stats
    assert stats is not None
    assert (stats.requests, stats.queries, stats.hits) == (0, 0, 0)
    assert connector.store == {}


def test_a_preempted_request_resumes_from_the_tier_with_the_same_output() -> None:
    # Six usable blocks of 4; each request grows to 4 blocks: one of them is preempted.
    scheduler, runner, connector = _with_tier(num_blocks=7, max_num_batched_tokens=32)
    prompts = {"a": list(range(10, 18)), "b": list(range(30, 38))}
    for rid, prompt in prompts.items():
        scheduler.add_request(make_request(rid, prompt, max_tokens=8))
    result, _ = _run(scheduler, runner, connector)
    assert scheduler.num_preemptions > 0
    assert connector.num_loaded_blocks > 0
    for rid, prompt in prompts.items():
        assert result.tokens[rid] == expected_tokens(prompt, 8)
    assert_pool_whole(scheduler)


def test_outputs_are_unchanged_by_the_tier_when_prefixes_do_not_fit_the_pool() -> None:
    scheduler, runner, connector = _with_tier(num_blocks=12)
    prefixes = [[p * 50 + i for i in range(12)] for p in range(4)]
    result = RunResult()
    for round_ in range(3):
        for p, prefix in enumerate(prefixes):
            scheduler.add_request(make_request(f"{round_}-{p}", prefix + [round_], max_tokens=3))
            _run(scheduler, runner, connector, result)
    for round_ in range(3):
        for p, prefix in enumerate(prefixes):
            assert result.tokens[f"{round_}-{p}"] == expected_tokens(prefix + [round_], 3)
    assert connector.num_loaded_blocks > 0
    assert_pool_whole(scheduler)


def test_requests_asking_for_prompt_logprobs_are_not_served_by_the_tier() -> None:
    scheduler, runner, connector = _with_tier()
    scheduler.add_request(make_request("a", SHARED + [1], max_tokens=2))
    _run(scheduler, runner, connector)
    _evict_everything(scheduler)
    scheduler.add_request(make_request("b", SHARED + [2], max_tokens=2, prompt_logprobs=1))
    _, schedules = _run(scheduler, runner, connector)
    assert schedules[0].num_scheduled_tokens == {"b": 13}
    assert connector.num_loaded_blocks == 0
