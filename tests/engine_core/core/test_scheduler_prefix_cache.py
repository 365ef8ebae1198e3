from __future__ import annotations

import logging

import pytest

from strand.engine_core.core.request import RequestStatus
from tests.engine_core.core.conftest import (
    FakeRunner,
    RunResult,
    assert_pool_whole,
    expected_tokens,
    make_request,
    make_scheduler,
    run_to_completion,
    step,
)

SHARED = list(range(100, 112))  # three 4-token blocks


def test_shared_prefix_is_served_from_the_cache() -> None:
    scheduler = make_scheduler(block_size=4)
    runner = FakeRunner(scheduler)
    first = make_request("first", SHARED + [1, 2], max_tokens=3)
    scheduler.add_request(first)
    run_to_completion(scheduler, runner)
    second = make_request("second", SHARED + [7, 8, 9], max_tokens=3)
    scheduler.add_request(second)
    result = RunResult()
    out, _ = step(scheduler, runner, result)
    assert out.scheduled_new_reqs[0].num_computed_tokens == 12
    assert out.num_scheduled_tokens == {"second": 3}
    run_to_completion(scheduler, runner, result=result)
    assert result.tokens["second"] == expected_tokens(second.prompt_token_ids, 3)
    assert result.outputs[0].num_cached_tokens == 12


def test_identical_prompt_recomputes_its_last_token() -> None:
    scheduler = make_scheduler(block_size=4)
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("a", SHARED, max_tokens=1))
    run_to_completion(scheduler, runner)
    scheduler.add_request(make_request("b", SHARED, max_tokens=2))
    out, _ = step(scheduler, runner)
    # A whole-prompt hit is capped one block short, so the last prompt token is computed.
    assert out.num_scheduled_tokens == {"b": 4}
    assert out.scheduled_new_reqs[0].num_computed_tokens == 8


def test_requests_sharing_a_prefix_in_one_step_agree_on_tokens() -> None:
    scheduler = make_scheduler(block_size=4)
    reqs = [make_request(f"r{i}", SHARED + [i], max_tokens=5) for i in range(4)]
    for r in reqs:
        scheduler.add_request(r)
    result = run_to_completion(scheduler)
    for r in reqs:
        assert result.tokens[r.request_id] == expected_tokens(r.prompt_token_ids, 5)


def test_cache_salt_isolates_tenants_in_the_scheduler() -> None:
    scheduler = make_scheduler(block_size=4)
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("alice1", SHARED + [1], cache_salt="alice"))
    run_to_completion(scheduler, runner)
    scheduler.add_request(make_request("bob", SHARED + [1], cache_salt="bob"))
    scheduler.add_request(make_request("alice2", SHARED + [1], cache_salt="alice"))
    out, _ = step(scheduler, runner)
    hits = {n.req_id: n.num_computed_tokens for n in out.scheduled_new_reqs}
    assert hits == {"bob": 0, "alice2": 12}


def test_hash_algo_xxhash_gives_hits_too() -> None:
    scheduler = make_scheduler(block_size=4, hash_algo="xxhash")
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("a", SHARED + [1]))
    run_to_completion(scheduler, runner)
    scheduler.add_request(make_request("b", SHARED + [2]))
    out, _ = step(scheduler, runner)
    assert out.scheduled_new_reqs[0].num_computed_tokens == 12


def test_generated_tokens_are_cached_for_later_requests() -> None:
    scheduler = make_scheduler(block_size=4)
    runner = FakeRunner(scheduler)
    prompt = SHARED[:6]
    scheduler.add_request(make_request("a", prompt, max_tokens=7))
    result = run_to_completion(scheduler, runner)
    continued = prompt + result.tokens["a"] + [5]  # 14 tokens: 3 full blocks seen before
    scheduler.add_request(make_request("b", continued))
    out, _ = step(scheduler, runner)
    assert out.scheduled_new_reqs[0].num_computed_tokens == 12


def test_reset_is_refused_while_requests_run(caplog: pytest.LogCaptureFixture) -> None:
    scheduler = make_scheduler(block_size=4)
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("a", SHARED + [1], max_tokens=5))
    step(scheduler, runner)
    with caplog.at_level(logging.WARNING):
        assert scheduler.reset_prefix_cache() is False
    assert "in use" in caplog.text
    assert scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block != {}


def test_reset_with_running_requests_preempts_them_and_output_is_unchanged() -> None:
    scheduler = make_scheduler(block_size=4)
    runner = FakeRunner(scheduler)
    result = RunResult()
    reqs = [make_request(f"r{i}", SHARED + [i], max_tokens=6) for i in range(2)]
    for r in reqs:
        scheduler.add_request(r)
    step(scheduler, runner, result)
    step(scheduler, runner, result)
    assert scheduler.reset_prefix_cache(reset_running_requests=True) is True
    assert scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block == {}
    assert all(r.status == RequestStatus.PREEMPTED for r in reqs)
    assert_pool_whole(scheduler)
    out, _ = step(scheduler, runner, result)
    assert out.preempted_req_ids == {"r0", "r1"}
    assert [n.req_id for n in out.scheduled_new_reqs] == ["r0", "r1"]
    run_to_completion(scheduler, runner, result=result)
    for r in reqs:
        assert result.tokens[r.request_id] == expected_tokens(r.prompt_token_ids, 6)


def test_reset_when_idle_succeeds_and_forgets_prefixes() -> None:
    scheduler = make_scheduler(block_size=4)
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("a", SHARED + [1]))
    run_to_completion(scheduler, runner)
    assert scheduler.reset_prefix_cache() is True
    scheduler.add_request(make_request("b", SHARED + [2]))
    out, _ = step(scheduler, runner)
    assert out.scheduled_new_reqs[0].num_computed_tokens == 0


def test_reset_clears_hit_metrics() -> None:
    scheduler = make_scheduler(block_size=4)
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("a", SHARED + [1]))
    run_to_completion(scheduler, runner)
    scheduler.add_request(make_request("b", SHARED + [2]))
    run_to_completion(scheduler, runner)
    stats = scheduler.make_stats().prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits) == (2, 26, 12)
    assert stats.hit_rate == pytest.approx(12 / 26)
    assert scheduler.reset_prefix_cache() is True
    stats = scheduler.make_stats().prefix_cache_stats
    assert (stats.requests, stats.queries, stats.hits, stats.hit_rate) == (0, 0, 0, 0.0)


class _Connector:
    def __init__(self, answer: bool | None) -> None:
        self.answer = answer
        self.calls = 0

    def reset_cache(self) -> bool | None:
        self.calls += 1
        return self.answer


@pytest.mark.parametrize(("answer", "expected"), [(None, True), (True, True), (False, False)])
def test_reset_connector_fails_only_when_the_connector_says_false(
        answer: bool | None, expected: bool) -> None:
    connector = _Connector(answer)
    scheduler = make_scheduler(connector=connector)
    assert scheduler.reset_prefix_cache(reset_connector=True) is expected
    assert connector.calls == 1


def test_connector_is_left_alone_without_reset_connector() -> None:
    connector = _Connector(False)
    scheduler = make_scheduler(connector=connector)
    assert scheduler.reset_prefix_cache() is True
    assert connector.calls == 0
