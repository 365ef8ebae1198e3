"""tests/v1/core/test_scheduler.py: the scheduler alone (no model), driven by a fake runner."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from strand.engine_core.config import CacheConfig, EngineArgs, SchedulerConfig
from strand.engine_core.core.engine import EngineCore
from strand.engine_core.core.engine_io import EngineCoreRequest
from strand.engine_core.core.request import RequestStatus
from strand.engine_core.core.runner_output import ModelRunnerOutput
from strand.engine_core.core.sched_output import SchedulerOutput
from strand.engine_core.core.scheduler import DuplicateRequestError, Scheduler
from strand.engine_core.sampling_params import SamplingParams
from strand.engine_core.speculative_config import SpeculativeConfig
from tests.conftest import copy_without_tokenizer
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


def _sampled(out: SchedulerOutput, tokens: dict[str, list[int]]) -> ModelRunnerOutput:
    """A runner output that samples the given tokens for the scheduled requests."""
    req_ids = list(out.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)},
                             [tokens.get(r, []) for r in req_ids])


def test_add_requests() -> None:
    scheduler = make_scheduler()
    for i in range(10):
        request = make_request(str(i), 8)
        scheduler.add_request(request)
        assert scheduler.requests[str(i)] is request
        assert len(scheduler.waiting) == i + 1
    with pytest.raises(DuplicateRequestError):
        scheduler.add_request(make_request("3", 8))


def test_finish_request() -> None:
    scheduler = make_scheduler()
    for i in range(10):
        scheduler.add_request(make_request(str(i), 8))
    for i in range(10):
        scheduler.finish_requests(str(i), RequestStatus.FINISHED_ABORTED)
        assert str(i) not in scheduler.requests
        assert len(scheduler.waiting) == 9 - i
    assert scheduler.finished_req_ids == {str(i) for i in range(10)}


def test_get_num_unfinished_requests() -> None:
    scheduler = make_scheduler()
    for i in range(10):
        scheduler.add_request(make_request(str(i), 8))
    for i in range(10):
        scheduler.finish_requests(str(i), RequestStatus.FINISHED_STOPPED)
        assert scheduler.get_num_unfinished_requests() == 9 - i


@pytest.mark.parametrize(("enable_prefix_caching", "prompt_logprobs"),
                         [(False, None), (True, 5)])
def test_schedule(enable_prefix_caching: bool, prompt_logprobs: int | None) -> None:
    scheduler = make_scheduler(enable_prefix_caching=enable_prefix_caching,
                               max_num_batched_tokens=200)
    requests = [make_request(str(i), 16, prompt_logprobs=prompt_logprobs) for i in range(10)]
    for request in requests:
        scheduler.add_request(request)
    out = scheduler.schedule()
    assert len(out.scheduled_new_reqs) == 10
    assert out.scheduled_cached_reqs.num_reqs == 0
    assert out.finished_req_ids == set()
    assert out.num_scheduled_tokens == {r.request_id: 16 for r in requests}
    assert len(scheduler.waiting) == 0 and len(scheduler.running) == 10
    assert scheduler.running == requests


def test_schedule_partial_requests() -> None:
    """Chunked prefill: the budget cuts the last request's prompt short."""
    scheduler = make_scheduler(max_num_batched_tokens=40, block_size=4)
    requests = [make_request(str(i), 16) for i in range(3)]
    for request in requests:
        scheduler.add_request(request)
    runner = FakeRunner(scheduler)
    out, outputs = step(scheduler, runner)
    assert out.num_scheduled_tokens == {"0": 16, "1": 16, "2": 8}
    assert {o.request_id for o in outputs} == {"0", "1"}  # "2" sampled nothing yet
    out, _ = step(scheduler, runner)
    assert out.num_scheduled_tokens == {"0": 1, "1": 1, "2": 8}


def test_schedule_concurrent_partial_requests() -> None:
    """long_prefill_token_threshold caps each request's chunk, so several prefill at once."""
    scheduler = make_scheduler(max_num_batched_tokens=64, long_prefill_token_threshold=10)
    for i in range(3):
        scheduler.add_request(make_request(str(i), 30))
    runner = FakeRunner(scheduler)
    out, _ = step(scheduler, runner)
    assert out.num_scheduled_tokens == {"0": 10, "1": 10, "2": 10}
    result = run_to_completion(scheduler, runner)
    for i in range(3):
        prompt = make_request(str(i), 30).prompt_token_ids
        assert result.tokens[str(i)] == expected_tokens(prompt, 4)


def test_stop_via_update_from_output() -> None:
    scheduler = make_scheduler()
    eos = 999
    a = make_request("a", 4, max_tokens=10, eos_token_id=eos)
    b = make_request("b", 4, max_tokens=10, stop_token_ids=[7])
    c = make_request("c", 4, max_tokens=2)
    for request in (a, b, c):
        scheduler.add_request(request)
    out = scheduler.schedule()
    outputs = scheduler.update_from_output(out, _sampled(out, {"a": [eos], "b": [7], "c": [5]}))
    by_id = {o.request_id: o for o in outputs}
    assert by_id["a"].finish_reason == "stop" and by_id["a"].stop_reason is None
    assert by_id["b"].finish_reason == "stop" and by_id["b"].stop_reason == 7
    assert by_id["c"].finish_reason is None
    assert [r.request_id for r in scheduler.running] == ["c"]
    assert scheduler.finished_req_ids == {"a", "b"}
    out = scheduler.schedule()
    outputs = scheduler.update_from_output(out, _sampled(out, {"c": [6]}))
    assert outputs[0].finish_reason == "length"
    assert c.output_token_ids == [5, 6]


def test_preempt_during_execution() -> None:
    """A request preempted while its step computes still gets that step's token."""
    scheduler = make_scheduler(enable_prefix_caching=False)
    request = make_request("0", 8, max_tokens=4)
    scheduler.add_request(request)
    out = scheduler.schedule()
    # The step is in flight; meanwhile every running request is preempted.
    assert scheduler.reset_prefix_cache(reset_running_requests=True)
    assert request.status == RequestStatus.PREEMPTED
    outputs = scheduler.update_from_output(out, _sampled(out, {"0": [42]}))
    assert [o.new_token_ids for o in outputs] == [[42]]
    assert request.output_token_ids == [42]
    assert request.status == RequestStatus.PREEMPTED and request in list(scheduler.waiting)
    # It resumes with the token: prompt + 42 recomputed, then decoding goes on.
    out = scheduler.schedule()
    assert out.preempted_req_ids == {"0"}
    assert [n.output_token_ids for n in out.scheduled_new_reqs] == [[42]]
    assert out.num_scheduled_tokens == {"0": 9}


def test_preempt_during_execution_finishing_token() -> None:
    scheduler = make_scheduler(enable_prefix_caching=False)
    request = make_request("0", 8, max_tokens=1)
    scheduler.add_request(request)
    out = scheduler.schedule()
    scheduler.reset_prefix_cache(reset_running_requests=True)
    outputs = scheduler.update_from_output(out, _sampled(out, {"0": [42]}))
    assert outputs[0].finish_reason == "length"
    assert not scheduler.has_unfinished_requests() and len(scheduler.waiting) == 0
    assert_pool_whole(scheduler)


def test_memory_leak() -> None:
    """Many requests through the scheduler leave nothing behind."""
    scheduler = make_scheduler(num_blocks=32, max_num_seqs=4)
    for i in range(40):
        scheduler.add_request(make_request(str(i), 5 + i % 7, max_tokens=3 + i % 4))
    run_to_completion(scheduler)
    assert not scheduler.requests and not scheduler.running and len(scheduler.waiting) == 0
    assert_pool_whole(scheduler)


def test_priority_scheduling_basic_ordering() -> None:
    scheduler = make_scheduler(policy="priority", max_num_seqs=1)
    for rid, priority in (("low", 5), ("high", 0), ("mid", 2)):
        scheduler.add_request(make_request(rid, 4, priority=priority))
    order: list[str] = []
    for _ in range(3):
        out = scheduler.schedule()
        order.extend(n.req_id for n in out.scheduled_new_reqs)
        scheduler.finish_requests(list(out.num_scheduled_tokens), RequestStatus.FINISHED_ABORTED)
    assert order == ["high", "mid", "low"]


def test_priority_scheduling_arrival_time_tiebreaker() -> None:
    scheduler = make_scheduler(policy="priority", max_num_seqs=1)
    scheduler.add_request(make_request("late", 4, priority=1, arrival_time=20.0))
    scheduler.add_request(make_request("early", 4, priority=1, arrival_time=10.0))
    assert [n.req_id for n in scheduler.schedule().scheduled_new_reqs] == ["early"]


def test_priority_scheduling_preemption() -> None:
    """Out of blocks, the worst-priority running request is preempted."""
    scheduler = make_scheduler(policy="priority", num_blocks=5, block_size=4,
                               enable_prefix_caching=False)
    runner = FakeRunner(scheduler)
    low = make_request("low", 7, max_tokens=6, priority=5)
    high = make_request("high", 7, max_tokens=6, priority=0)
    scheduler.add_request(low)
    step(scheduler, runner)
    scheduler.add_request(high)
    result = RunResult()
    run_to_completion(scheduler, runner, result=result)
    assert low.num_preemptions >= 1 and high.num_preemptions == 0
    assert result.tokens["high"] == expected_tokens(high.prompt_token_ids, 6)


def test_priority_scheduling_mixed_priority_and_arrival() -> None:
    scheduler = make_scheduler(policy="priority", max_num_seqs=1)
    for rid, priority, arrival in (("a", 2, 1.0), ("b", 1, 3.0), ("c", 1, 2.0), ("d", 0, 4.0)):
        scheduler.add_request(make_request(rid, 4, priority=priority, arrival_time=arrival))
    order: list[str] = []
    for _ in range(4):
        out = scheduler.schedule()
        order.extend(n.req_id for n in out.scheduled_new_reqs)
        scheduler.finish_requests(list(out.num_scheduled_tokens), RequestStatus.FINISHED_ABORTED)
    assert order == ["d", "c", "b", "a"]


def test_priority_scheduling_no_preemption_when_space_available() -> None:
    scheduler = make_scheduler(policy="priority", num_blocks=64)
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("low", 8, priority=5))
    step(scheduler, runner)
    scheduler.add_request(make_request("high", 8, priority=0))
    out, _ = step(scheduler, runner)
    assert out.preempted_req_ids == set()
    assert set(out.num_scheduled_tokens) == {"low", "high"}


def test_priority_scheduling_with_limited_slots() -> None:
    """max_num_seqs full: a better-priority arrival waits (no preemption for slots)."""
    scheduler = make_scheduler(policy="priority", max_num_seqs=1)
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("low", 4, max_tokens=3, priority=5))
    step(scheduler, runner)
    scheduler.add_request(make_request("high", 4, max_tokens=3, priority=0))
    out, _ = step(scheduler, runner)
    assert set(out.num_scheduled_tokens) == {"low"} and len(scheduler.waiting) == 1
    result = run_to_completion(scheduler, runner)
    assert result.finish_reasons == {"low": "length", "high": "length"}


def test_schedule_order_fcfs() -> None:
    scheduler = make_scheduler(max_num_seqs=2)
    for rid in ("a", "b", "c"):
        scheduler.add_request(make_request(rid, 4))
    out = scheduler.schedule()
    assert [n.req_id for n in out.scheduled_new_reqs] == ["a", "b"]
    assert [r.request_id for r in scheduler.waiting] == ["c"]


def test_priority_scheduling_fcfs_fallback() -> None:
    scheduler = make_scheduler(policy="priority", max_num_seqs=1)
    for rid in ("a", "b", "c"):
        scheduler.add_request(make_request(rid, 4))  # equal priorities: arrival order
    assert [n.req_id for n in scheduler.schedule().scheduled_new_reqs] == ["a"]


def test_structured_output_request() -> None:
    # vLLM parks a constrained request in WAITING_FOR_FSM until its grammar compiles; Strand's
    # engine compiles at add_request (a bad spec never reaches the scheduler), so it is
    # scheduled at once and its constraint travels to the runner with its params.
    from strand.engine_core.structured_output.params import StructuredOutputsParams

    scheduler = make_scheduler()
    constraint = StructuredOutputsParams(choice=["a", "b"])
    scheduler.add_request(make_request("so", 4, structured_outputs=constraint))
    scheduler.add_request(make_request("free", 4))
    out = scheduler.schedule()
    new = {n.req_id: n for n in out.scheduled_new_reqs}
    assert set(new) == {"so", "free"}
    assert new["so"].sampling_params.structured_outputs == constraint
    assert new["free"].sampling_params.structured_outputs is None


@pytest.mark.parametrize("enable_prefix_caching", [False, True])
@pytest.mark.parametrize("prompt_logprobs", [None, 5])
def test_schedule_concurrent_batches(enable_prefix_caching: bool,
                                     prompt_logprobs: int | None) -> None:
    """vLLM's: with a batch queue (max_concurrent_batches 2) step N+1 is scheduled before step
    N's output is back. A request in flight is not scheduled again until its token arrives;
    the second request's prefill runs meanwhile."""
    scheduler = make_scheduler(num_blocks=512, block_size=16, max_num_batched_tokens=1024,
                               max_num_seqs=2, max_model_len=1024,
                               enable_prefix_caching=enable_prefix_caching)
    first = make_request("first", 512, max_tokens=8, prompt_logprobs=prompt_logprobs)
    second = make_request("second", 512, max_tokens=8, prompt_logprobs=prompt_logprobs)
    scheduler.add_request(first)
    out0 = scheduler.schedule()
    assert [n.req_id for n in out0.scheduled_new_reqs] == ["first"]
    assert out0.num_scheduled_tokens["first"] == 512
    # The first request is in flight: only the second is scheduled.
    scheduler.add_request(second)
    out1 = scheduler.schedule()
    assert [n.req_id for n in out1.scheduled_new_reqs] == ["second"]
    assert out1.num_scheduled_tokens == {"second": 512}
    # The first's token comes back: it decodes while the second is still in flight.
    scheduler.update_from_output(out0, _sampled(out0, {"first": [7]}))
    out2 = scheduler.schedule()
    assert out2.num_scheduled_tokens == {"first": 1}
    scheduler.update_from_output(out1, _sampled(out1, {"second": [9]}))
    assert first.output_token_ids == [7] and second.output_token_ids == [9]


def test_schedule_skip_tokenizer_init(tiny_model_dir: Path, tmp_path: Path) -> None:
    """vLLM's: an engine built with skip_tokenizer_init schedules every new request (nothing
    waits on a tokenizer or a grammar). Here the model's directory has no tokenizer at all and
    the structured-output compiler is never built."""
    model = copy_without_tokenizer(tiny_model_dir, tmp_path / "no-tokenizer")
    core = EngineCore.from_engine_args(EngineArgs(
        model=str(model), skip_tokenizer_init=True, dtype="float32", device="cpu",
        num_gpu_blocks_override=64, max_model_len=128))
    for i in range(5):
        core.add_request(EngineCoreRequest(
            request_id=f"r{i}", prompt_token_ids=[1, 2, 3 + i],
            sampling_params=SamplingParams(max_tokens=2), eos_token_id=None,
            arrival_time=time.time()))
    core.step()
    assert core.last_scheduler_output is not None
    assert len(core.last_scheduler_output.scheduled_new_reqs) == 5
    assert core.runner.grammars.cache is None


def _drafting_scheduler(drafts: dict[str, list[int]], k: int) -> Scheduler:
    """vLLM hands its scheduler drafts from the worker (update_draft_token_ids); here the
    scheduler asks its proposer in schedule(): the proposer answers the given drafts."""
    scheduler = Scheduler(
        SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16, max_model_len=128,
                        speculative=SpeculativeConfig.from_dict(
                            {"method": "ngram", "num_speculative_tokens": k})),
        CacheConfig(block_size=4), 64)
    assert scheduler.proposer is not None
    scheduler.proposer.propose = (  # type: ignore[method-assign]
        lambda req_id, token_ids, max_drafts: list(drafts.get(req_id, []))[:max_drafts])
    return scheduler


# vLLM's cases (they mirror its rejection-sampler tests): drafts per request, the tokens the
# verification returned, and (drafts, draft tokens, accepted tokens, accepted per position).
@pytest.mark.parametrize("spec_tokens, output_tokens, expected", [
    ([[1, 2, 3]], [[1, 2, 3, 4]], (1, 3, 3, [1, 1, 1])),  # perfect match
    ([[1, 2, 3]], [[1, 5]], (1, 3, 1, [1, 0, 0])),  # early mismatch
    ([[1, 2], [3]], [[1, 2, 5], [3, 4]], (2, 3, 3, [2, 1])),  # multiple sequences
    ([[1]], [[1, 2]], (1, 1, 1, [1])),  # single token sequence
    ([[]], [[5]], (0, 0, 0, [0])),  # empty sequence
    ([[1, 2, 3], [4, 5, 6]], [[1, 2, 7], [4, 8]], (2, 6, 3, [2, 1, 0])),  # multiple mismatches
])
def test_schedule_spec_decoding_stats(spec_tokens: list[list[int]],
                                      output_tokens: list[list[int]],
                                      expected: tuple[int, int, int, list[int]]) -> None:
    """vLLM's: drafted tokens are scheduled with their request's next token, and the stats
    count drafts, draft tokens and accepted tokens per position. vLLM reports no stats object
    for a step without drafts; here the totals since start are reported, all zero then."""
    ids = [f"r{i}" for i in range(len(spec_tokens))]
    scheduler = _drafting_scheduler(dict(zip(ids, spec_tokens, strict=True)),
                                    max(1, max(len(t) for t in spec_tokens)))
    for req_id in ids:
        scheduler.add_request(make_request(req_id, 1, max_tokens=16))
    out = scheduler.schedule()  # the prompts: no drafts yet
    assert len(out.scheduled_new_reqs) == len(ids) and out.total_num_scheduled_tokens == len(ids)
    assert not out.scheduled_spec_decode_tokens
    scheduler.update_from_output(out, _sampled(out, {r: [0] for r in ids}))
    for req_id in ids:
        assert scheduler.requests[req_id].num_tokens == 2  # the prompt token and the sampled one

    out = scheduler.schedule()  # each request's last token and its drafts, to verify
    assert not out.scheduled_new_reqs
    assert out.total_num_scheduled_tokens == len(ids) + sum(len(t) for t in spec_tokens)
    for req_id, drafts in zip(ids, spec_tokens, strict=True):
        assert out.num_scheduled_tokens[req_id] == 1 + len(drafts)
        assert out.scheduled_spec_decode_tokens.get(req_id, []) == drafts
    scheduler.update_from_output(out, _sampled(out, dict(zip(ids, output_tokens, strict=True))))
    stats = scheduler.make_stats().spec_decoding
    assert stats is not None
    num_drafts, num_draft_tokens, num_accepted, per_pos = expected
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (
        num_drafts, num_draft_tokens, num_accepted)
    assert stats.accepted_per_pos + [0] * (len(per_pos) - len(stats.accepted_per_pos)) == per_pos


def test_spec_decoding_stats_empty_output() -> None:
    """vLLM's regression test: a verified step that returns no tokens for a drafted request
    (a tensor-parallel worker's empty result here) counts nothing, never a negative."""
    scheduler = _drafting_scheduler({"r": [1, 2, 3]}, 3)
    scheduler.add_request(make_request("r", 1, max_tokens=16))
    out = scheduler.schedule()
    scheduler.update_from_output(out, _sampled(out, {"r": [0]}))
    out = scheduler.schedule()
    assert out.scheduled_spec_decode_tokens["r"] == [1, 2, 3]
    scheduler.update_from_output(out, _sampled(out, {"r": []}))
    stats = scheduler.make_stats().spec_decoding
    assert stats is not None and stats.num_drafts == 0 and stats.num_accepted_tokens == 0


@pytest.mark.parametrize("name", [
    "test_schedule_multimodal_requests", "test_chunked_prefill_disabled_for_encoder_decoder",
])
def test_missing_features(name: str) -> None:
    missing = {
        "test_schedule_multimodal_requests": "multimodal inputs",
        "test_chunked_prefill_disabled_for_encoder_decoder": "encoder-decoder models",
    }
    pytest.skip(f"missing feature: {missing[name]}")
