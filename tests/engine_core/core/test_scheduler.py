from __future__ import annotations

import pytest

from strand.engine_core.core.request import RequestStatus
from strand.engine_core.core.scheduler import DuplicateRequestError
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


def test_first_schedule_sends_the_whole_request_then_only_diffs() -> None:
    scheduler = make_scheduler(block_size=4)
    scheduler.add_request(make_request("r", 6, max_tokens=5))
    runner = FakeRunner(scheduler)
    first, _ = step(scheduler, runner)
    assert [n.req_id for n in first.scheduled_new_reqs] == ["r"]
    assert len(first.scheduled_new_reqs[0].block_ids) == 2
    assert first.num_scheduled_tokens == {"r": 6}
    second, _ = step(scheduler, runner)  # computes token 7: still inside block 2
    assert second.scheduled_new_reqs == []
    assert second.scheduled_cached_reqs.req_ids == ["r"]
    assert second.scheduled_cached_reqs.new_block_ids == [[]]
    assert second.scheduled_cached_reqs.num_computed_tokens == [6]
    third, _ = step(scheduler, runner)  # computes token 8
    fourth, _ = step(scheduler, runner)  # computes token 9: needs block 3
    assert third.scheduled_cached_reqs.new_block_ids == [[]]
    assert len(fourth.scheduled_cached_reqs.new_block_ids[0]) == 1


def test_num_computed_tokens_advances_at_schedule_time() -> None:
    scheduler = make_scheduler()
    request = make_request("r", 7)
    scheduler.add_request(request)
    scheduler.schedule()
    assert request.num_computed_tokens == 7


def test_requests_join_a_running_batch_mid_stream() -> None:
    scheduler = make_scheduler()
    runner = FakeRunner(scheduler)
    result = RunResult()
    scheduler.add_request(make_request("a", 5, max_tokens=6))
    step(scheduler, runner, result)
    step(scheduler, runner, result)
    scheduler.add_request(make_request("b", 3, max_tokens=2))
    out, _ = step(scheduler, runner, result)
    assert [n.req_id for n in out.scheduled_new_reqs] == ["b"]
    assert out.scheduled_cached_reqs.req_ids == ["a"]
    assert out.num_scheduled_tokens == {"a": 1, "b": 3}
    run_to_completion(scheduler, runner, result=result)
    assert result.tokens["a"] == expected_tokens(make_request("a", 5).prompt_token_ids, 6)
    assert result.tokens["b"] == expected_tokens(make_request("b", 3).prompt_token_ids, 2)


def test_long_prompt_is_split_across_steps_under_the_budget() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=8)
    runner = FakeRunner(scheduler)
    request = make_request("r", 20, max_tokens=2)
    scheduler.add_request(request)
    chunks = []
    sampled_per_step = []
    for _ in range(3):
        out, outputs = step(scheduler, runner)
        chunks.append(out.num_scheduled_tokens["r"])
        sampled_per_step.append([t for o in outputs for t in o.new_token_ids])
    assert chunks == [8, 8, 4]
    assert sampled_per_step[:2] == [[], []]
    assert sampled_per_step[2] == expected_tokens(request.prompt_token_ids, 1)


def test_decodes_only_once_nothing_waits_and_every_prompt_is_computed() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=8)
    runner = FakeRunner(scheduler)
    assert scheduler.decodes_only()  # nothing at all: nothing to prefill
    scheduler.add_request(make_request("long", 20, max_tokens=4))
    assert not scheduler.decodes_only()  # it waits
    step(scheduler, runner)
    step(scheduler, runner)
    assert not scheduler.decodes_only()  # running, 16 of its 20 prompt tokens computed
    step(scheduler, runner)  # the last 4, and its first token
    assert scheduler.decodes_only()
    scheduler.add_request(make_request("new", 3, max_tokens=2))
    assert not scheduler.decodes_only()


def test_long_prefill_threshold_caps_one_chunk() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=64, long_prefill_token_threshold=5)
    scheduler.add_request(make_request("r", 12))
    assert scheduler.schedule().num_scheduled_tokens == {"r": 5}


def test_running_requests_take_the_budget_before_waiting_ones() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=10)
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("long", 30))
    step(scheduler, runner)
    scheduler.add_request(make_request("late", 3))
    out, _ = step(scheduler, runner)
    assert out.num_scheduled_tokens == {"long": 10}
    assert out.total_num_scheduled_tokens == 10


def test_budget_left_by_running_requests_goes_to_waiting_ones() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=10)
    for rid in ("a", "b", "c"):
        scheduler.add_request(make_request(rid, 4))
    assert scheduler.schedule().num_scheduled_tokens == {"a": 4, "b": 4, "c": 2}


def test_max_num_seqs_caps_the_batch() -> None:
    scheduler = make_scheduler(max_num_seqs=2)
    for rid in ("a", "b", "c"):
        scheduler.add_request(make_request(rid, 3))
    out = scheduler.schedule()
    assert set(out.num_scheduled_tokens) == {"a", "b"}
    assert scheduler.make_stats().num_waiting_reqs == 1


def test_finishes_on_max_tokens_with_length() -> None:
    scheduler = make_scheduler()
    scheduler.add_request(make_request("r", 5, max_tokens=3))
    result = run_to_completion(scheduler)
    assert result.finish_reasons == {"r": "length"}
    assert len(result.tokens["r"]) == 3
    assert_pool_whole(scheduler)


def _second_token(prompt_len: int = 5) -> int:
    return expected_tokens(make_request("r", prompt_len).prompt_token_ids, 2)[1]


def test_finishes_on_eos_with_stop() -> None:
    scheduler = make_scheduler()
    scheduler.add_request(make_request("r", 5, max_tokens=10, eos_token_id=_second_token()))
    result = run_to_completion(scheduler)
    assert result.finish_reasons == {"r": "stop"}
    assert result.tokens["r"][-1] == _second_token()
    assert len(result.tokens["r"]) == 2


def test_ignore_eos_runs_to_max_tokens() -> None:
    scheduler = make_scheduler()
    scheduler.add_request(make_request("r", 5, max_tokens=4, eos_token_id=_second_token(),
                                       ignore_eos=True))
    result = run_to_completion(scheduler)
    assert (result.finish_reasons["r"], len(result.tokens["r"])) == ("length", 4)


def test_eos_before_min_tokens_does_not_stop() -> None:
    scheduler = make_scheduler()
    scheduler.add_request(make_request("r", 5, max_tokens=4, eos_token_id=_second_token(),
                                       min_tokens=3))
    result = run_to_completion(scheduler)
    assert (result.finish_reasons["r"], len(result.tokens["r"])) == ("length", 4)


def test_min_tokens_beyond_max_model_len_still_stops_at_max_model_len() -> None:
    scheduler = make_scheduler(max_model_len=12)
    request = make_request("r", 5, max_tokens=None, min_tokens=50)
    scheduler.add_request(request)
    result = run_to_completion(scheduler)
    assert (result.finish_reasons["r"], request.num_tokens) == ("length", 12)


def test_stop_token_id_stops_and_is_the_stop_reason() -> None:
    scheduler = make_scheduler()
    stop_id = _second_token()
    scheduler.add_request(make_request("r", 5, max_tokens=10, stop_token_ids=[stop_id]))
    result = run_to_completion(scheduler)
    final = result.outputs[-1]
    assert (final.finish_reason, final.stop_reason) == ("stop", stop_id)
    assert len(result.tokens["r"]) == 2


def test_max_tokens_none_runs_to_max_model_len() -> None:
    scheduler = make_scheduler(max_model_len=12)
    request = make_request("r", 5, max_tokens=None)
    scheduler.add_request(request)
    assert request.max_tokens == 7
    result = run_to_completion(scheduler)
    assert (result.finish_reasons["r"], request.num_tokens) == ("length", 12)


def test_max_tokens_is_capped_by_max_model_len() -> None:
    scheduler = make_scheduler(max_model_len=12)
    request = make_request("r", 5, max_tokens=100)
    scheduler.add_request(request)
    assert request.max_tokens == 7


def test_prompt_that_leaves_no_room_is_refused_naming_max_model_len() -> None:
    scheduler = make_scheduler(max_model_len=12)
    with pytest.raises(ValueError, match=r"max_model_len \(12\)"):
        scheduler.add_request(make_request("r", 12))
    assert not scheduler.has_unfinished_requests()
    assert len(scheduler.waiting) == 0


def test_request_bigger_than_the_pool_is_refused_and_nothing_changes() -> None:
    scheduler = make_scheduler(num_blocks=5, block_size=4)  # 16 token slots
    request = make_request("r", 10, max_tokens=8)  # 17 slots needed
    with pytest.raises(ValueError, match=r"num_blocks - 1 \(4\)"):
        scheduler.add_request(request)
    assert request.max_tokens == 16  # the dataclass default: untouched
    assert request.block_hashes == []
    assert scheduler.get_num_unfinished_requests() == 0


def test_request_that_exactly_fits_the_pool_is_accepted() -> None:
    scheduler = make_scheduler(num_blocks=5, block_size=4)
    scheduler.add_request(make_request("r", 10, max_tokens=7))  # 16 slots
    assert run_to_completion(scheduler).finish_reasons == {"r": "length"}


def test_empty_prompt_is_refused() -> None:
    with pytest.raises(ValueError, match="prompt_token_ids"):
        make_scheduler().add_request(make_request("r", []))


def test_duplicate_request_id_is_refused() -> None:
    scheduler = make_scheduler()
    scheduler.add_request(make_request("r", 3))
    with pytest.raises(DuplicateRequestError, match="already exists"):
        scheduler.add_request(make_request("r", 3))
    assert scheduler.get_num_unfinished_requests() == 1


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        make_scheduler(max_num_batched_tokens=0)
    with pytest.raises(ValueError, match="policy"):
        make_scheduler(policy="lifo")


def test_abort_of_a_running_request_frees_its_blocks() -> None:
    scheduler = make_scheduler()
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("r", 9, max_tokens=10))
    step(scheduler, runner)
    assert scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 60
    scheduler.finish_requests("r", RequestStatus.FINISHED_ABORTED)
    assert_pool_whole(scheduler)
    assert not scheduler.has_unfinished_requests()
    assert scheduler.schedule().finished_req_ids == {"r"}


def test_abort_of_a_waiting_request_removes_it() -> None:
    scheduler = make_scheduler()
    request = make_request("r", 4)
    scheduler.add_request(request)
    scheduler.finish_requests(["r"], RequestStatus.FINISHED_ABORTED)
    assert request.status == RequestStatus.FINISHED_ABORTED
    assert scheduler.schedule().num_scheduled_tokens == {}


def test_abort_ignores_unknown_ids() -> None:
    scheduler = make_scheduler()
    scheduler.add_request(make_request("r", 4))
    scheduler.finish_requests(["nope", "r", "r"], RequestStatus.FINISHED_ABORTED)
    assert scheduler.get_num_unfinished_requests() == 0


def test_abort_between_schedule_and_update_drops_the_result() -> None:
    scheduler = make_scheduler()
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("r", 4))
    out = scheduler.schedule()
    runner_output = runner.execute(out)
    scheduler.finish_requests("r", RequestStatus.FINISHED_ABORTED)
    assert scheduler.update_from_output(out, runner_output) == []
    assert_pool_whole(scheduler)


def test_finished_request_is_reported_to_the_runner_next_step() -> None:
    scheduler = make_scheduler()
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("r", 4, max_tokens=1))
    _, outputs = step(scheduler, runner)
    assert outputs[0].finish_reason == "length"
    assert scheduler.schedule().finished_req_ids == {"r"}


def test_output_carries_logprob_rows_cache_info_and_schedule_time() -> None:
    scheduler = make_scheduler()
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("plain", 4))
    scheduler.add_request(make_request("lp", 4, logprobs=1))
    _, outputs = step(scheduler, runner)
    by_id = {o.request_id: o for o in outputs}
    assert by_id["plain"].new_logprobs is None
    lp = by_id["lp"].new_logprobs
    assert lp is not None
    assert lp.logprob_token_ids == [[by_id["lp"].new_token_ids[0]]]
    assert by_id["lp"].num_cached_tokens == 0
    assert by_id["lp"].first_scheduled_time is not None
    # Reported once, as preemptions are: a later output of the request does not repeat it.
    _, later = step(scheduler, runner)
    assert [o.first_scheduled_time for o in later] == [None, None]


def test_prompt_logprobs_arrive_with_each_prefill_chunk() -> None:
    scheduler = make_scheduler(max_num_batched_tokens=4)
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("r", 6, prompt_logprobs=0))
    _, first = step(scheduler, runner)
    _, second = step(scheduler, runner)
    assert first[0].new_token_ids == [] and first[0].new_prompt_logprobs is not None
    assert len(first[0].new_prompt_logprobs.logprobs) == 4
    assert second[0].new_prompt_logprobs is not None
    assert len(second[0].new_prompt_logprobs.logprobs) == 2
    assert len(second[0].new_token_ids) == 1


def test_stats_report_queue_lengths_and_usage() -> None:
    scheduler = make_scheduler(num_blocks=9, max_num_seqs=1)  # 8 allocatable
    scheduler.add_request(make_request("a", 8))
    scheduler.add_request(make_request("b", 8))
    scheduler.schedule()
    stats = scheduler.make_stats()
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (1, 1)
    assert stats.kv_cache_usage == 0.25
