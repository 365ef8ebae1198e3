from __future__ import annotations

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


def test_preempted_requests_still_finish_with_the_same_tokens() -> None:
    scheduler = make_scheduler(num_blocks=9, block_size=4)  # 8 allocatable, 4 per request
    requests = [make_request(f"r{i}", 6, max_tokens=10) for i in range(4)]
    for r in requests:
        scheduler.add_request(r)
    result = run_to_completion(scheduler)
    assert scheduler.num_preemptions > 0
    for r in requests:
        assert result.tokens[r.request_id] == expected_tokens(r.prompt_token_ids, 10)
    assert_pool_whole(scheduler)


def test_same_tokens_with_preemption_and_without_prefix_caching() -> None:
    scheduler = make_scheduler(num_blocks=9, block_size=4, enable_prefix_caching=False)
    requests = [make_request(f"r{i}", 6, max_tokens=10) for i in range(4)]
    for r in requests:
        scheduler.add_request(r)
    result = run_to_completion(scheduler)
    assert scheduler.num_preemptions > 0
    assert all(result.tokens[r.request_id] == expected_tokens(r.prompt_token_ids, 10)
               for r in requests)


def _three_decoding(policy: str = "fcfs") -> tuple:  # type: ignore[type-arg]
    scheduler = make_scheduler(num_blocks=5, block_size=4, policy=policy)  # 4 allocatable
    runner = FakeRunner(scheduler)
    reqs = [make_request(rid, 4, max_tokens=4) for rid in ("a", "b", "c")]
    for r in reqs:
        scheduler.add_request(r)
    step(scheduler, runner)  # 3 blocks used; each now needs a second block
    return scheduler, runner, reqs


def test_fcfs_preempts_the_newest_running_request() -> None:
    scheduler, runner, (a, b, c) = _three_decoding()
    out, _ = step(scheduler, runner)
    assert out.preempted_req_ids == {"c"}
    assert out.num_scheduled_tokens == {"a": 1, "b": 1}
    assert c.status == RequestStatus.PREEMPTED
    assert c.num_computed_tokens == 0
    assert "c" not in scheduler.kv_cache_manager.req_to_blocks


def test_preempted_request_goes_back_to_the_head_of_the_queue() -> None:
    scheduler, runner, (_, _, c) = _three_decoding()
    step(scheduler, runner)
    scheduler.add_request(make_request("d", 4))
    assert list(scheduler.waiting)[0] is c


def test_no_admission_in_a_step_that_preempted() -> None:
    scheduler, runner, _ = _three_decoding()
    scheduler.add_request(make_request("d", 1, max_tokens=1))
    out, _ = step(scheduler, runner)
    assert "d" not in out.num_scheduled_tokens


def test_resumed_request_is_resent_whole_with_its_output_tokens() -> None:
    scheduler, runner, (a, b, c) = _three_decoding()
    step(scheduler, runner)  # c preempted after 1 output token
    first_output = list(c.output_token_ids)
    scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)
    out, _ = step(scheduler, runner)
    (resumed,) = out.scheduled_new_reqs
    assert resumed.req_id == "c"
    assert resumed.output_token_ids == first_output
    assert len(resumed.block_ids) == 2  # 5 tokens of 4-token blocks
    # b took c's freed block, so nothing of c is cached: all 5 tokens are recomputed.
    assert resumed.num_computed_tokens == 0
    assert out.num_scheduled_tokens["c"] == 5


def test_priority_preempts_the_worst_even_if_already_scheduled() -> None:
    scheduler = make_scheduler(num_blocks=4, block_size=4, policy="priority")  # 3 allocatable
    runner = FakeRunner(scheduler)
    result = RunResult()
    low = make_request("low", 4, max_tokens=6, priority=5)
    scheduler.add_request(low)
    step(scheduler, runner, result)
    high = make_request("high", 4, max_tokens=6, priority=0)
    scheduler.add_request(high)
    step(scheduler, runner, result)  # low takes its 2nd block, high its 1st: pool full
    out, _ = step(scheduler, runner, result)  # high needs a block; low was scheduled first
    assert out.preempted_req_ids == {"low"}
    assert out.num_scheduled_tokens == {"high": 1}
    assert out.scheduled_cached_reqs.req_ids == ["high"]
    run_to_completion(scheduler, runner, result=result)
    assert result.tokens["low"] == expected_tokens(low.prompt_token_ids, 6)
    assert result.tokens["high"] == expected_tokens(high.prompt_token_ids, 6)


def test_a_request_that_alone_fills_the_pool_never_deadlocks() -> None:
    scheduler = make_scheduler(num_blocks=5, block_size=4, max_num_batched_tokens=6)
    big = make_request("big", 10, max_tokens=7)  # needs all 4 blocks at its end
    smalls = [make_request(f"s{i}", 3, max_tokens=5) for i in range(3)]
    scheduler.add_request(smalls[0])
    scheduler.add_request(big)
    for s in smalls[1:]:
        scheduler.add_request(s)
    result = run_to_completion(scheduler, max_steps=200)
    assert result.tokens["big"] == expected_tokens(big.prompt_token_ids, 7)
    for s in smalls:
        assert result.tokens[s.request_id] == expected_tokens(s.prompt_token_ids, 5)
    assert_pool_whole(scheduler)


def _admission_order(policy: str, specs: list[tuple[str, int]]) -> list[str]:
    scheduler = make_scheduler(max_num_seqs=1, policy=policy)
    runner = FakeRunner(scheduler)
    for rid, priority in specs:
        scheduler.add_request(make_request(rid, 3, max_tokens=1, priority=priority))
    order = []
    while scheduler.has_unfinished_requests():
        out, _ = step(scheduler, runner)
        order += [n.req_id for n in out.scheduled_new_reqs]
    return order


def test_priority_policy_admits_lower_values_first_then_earlier_arrivals() -> None:
    specs = [("x", 2), ("y", 0), ("z", 1), ("w", 0)]
    assert _admission_order("priority", specs) == ["y", "w", "z", "x"]


def test_fcfs_policy_ignores_priority() -> None:
    specs = [("x", 2), ("y", 0), ("z", 1), ("w", 0)]
    assert _admission_order("fcfs", specs) == ["x", "y", "z", "w"]


def test_abort_of_a_preempted_request_removes_it_from_the_queue() -> None:
    scheduler, runner, (_, _, c) = _three_decoding()
    step(scheduler, runner)
    scheduler.finish_requests("c", RequestStatus.FINISHED_ABORTED)
    assert len(scheduler.waiting) == 0
    run_to_completion(scheduler, runner)
    assert_pool_whole(scheduler)



def test_a_victim_scheduled_earlier_in_the_same_step_leaves_no_uncomputed_block_cached() -> None:
    # Blocks are registered in the prefix cache when allocated, before their step computes them.
    scheduler = make_scheduler(num_blocks=6, block_size=4, policy="priority",
                               long_prefill_token_threshold=5)  # 5 allocatable
    runner = FakeRunner(scheduler)
    result = RunResult()
    low = make_request("low", 13, max_tokens=8, priority=5)
    scheduler.add_request(low)
    step(scheduler, runner, result)  # low: tokens 0..4
    high = make_request("high", 4, max_tokens=8, priority=0)
    scheduler.add_request(high)
    step(scheduler, runner, result)  # low: 5..9; high admitted
    computed = low.num_computed_tokens
    # low is scheduled first (10..14, filling its third block), then high needs a block and
    # low, the worst priority, is preempted before that forward ever runs.
    out, _ = step(scheduler, runner, result)
    assert out.preempted_req_ids == {"low"}
    cached = scheduler.kv_cache_manager.block_pool.cached_block_hash_to_block
    uncomputed = [h for i, h in enumerate(low.block_hashes) if (i + 1) * 4 > computed]
    assert uncomputed and not any(h in cached for h in uncomputed)
    run_to_completion(scheduler, runner, result=result)  # the fake runner checks every slot
    assert result.tokens["low"] == expected_tokens(low.prompt_token_ids, 8)
    assert result.tokens["high"] == expected_tokens(high.prompt_token_ids, 8)
    assert_pool_whole(scheduler)
