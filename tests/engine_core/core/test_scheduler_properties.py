"""Random add / step / abort / reset sequences keep the block pool consistent and outputs exact."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strand.engine_core.core.request import RequestStatus
from tests.engine_core.core.conftest import (
    FakeRunner,
    RunResult,
    assert_pool_whole,
    check_invariants,
    expected_tokens,
    make_request,
    make_scheduler,
    run_to_completion,
    step,
)

PREFIXES = [list(range(10, 22)), list(range(50, 58)), []]

_op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, len(PREFIXES) - 1), st.integers(1, 10),
              st.integers(1, 8), st.sampled_from([None, "s1"]), st.integers(0, 3)),
    st.tuples(st.just("step")),
    st.tuples(st.just("step")),
    st.tuples(st.just("abort"), st.integers(0, 50)),
    st.tuples(st.just("reset"), st.booleans()),
)


@settings(max_examples=200, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(num_blocks=st.integers(4, 24), block_size=st.sampled_from([2, 4]),
       budget=st.integers(3, 24), threshold=st.sampled_from([0, 3]),
       policy=st.sampled_from(["fcfs", "priority"]), caching=st.booleans(),
       ops=st.lists(_op, min_size=1, max_size=40))
def test_random_operations_keep_the_pool_consistent_and_outputs_exact(
        num_blocks: int, block_size: int, budget: int, threshold: int, policy: str,
        caching: bool, ops: list[tuple]) -> None:  # type: ignore[type-arg]
    scheduler = make_scheduler(num_blocks=num_blocks, block_size=block_size,
                               max_num_batched_tokens=budget, max_num_seqs=4, max_model_len=32,
                               policy=policy, enable_prefix_caching=caching,
                               long_prefill_token_threshold=threshold)
    runner = FakeRunner(scheduler)
    result = RunResult()
    added: dict[str, tuple[list[int], int]] = {}
    aborted: set[str] = set()
    for n, op in enumerate(ops):
        if op[0] == "add":
            _, prefix, suffix_len, max_tokens, salt, priority = op
            prompt = PREFIXES[prefix] + [(n * 31 + i) % 997 for i in range(suffix_len)]
            request = make_request(f"r{n}", prompt, max_tokens=max_tokens, cache_salt=salt,
                                   priority=priority)
            before = scheduler.get_num_unfinished_requests()
            try:
                scheduler.add_request(request)
                added[request.request_id] = (prompt, request.max_tokens)
            except ValueError:
                assert scheduler.get_num_unfinished_requests() == before
        elif op[0] == "step":
            if scheduler.has_unfinished_requests():
                step(scheduler, runner, result)
        elif op[0] == "abort":
            ids = sorted(scheduler.requests)
            if ids:
                victim = ids[op[1] % len(ids)]
                scheduler.finish_requests(victim, RequestStatus.FINISHED_ABORTED)
                aborted.add(victim)
        else:
            ok = scheduler.reset_prefix_cache(reset_running_requests=op[1])
            assert ok == (op[1] or not scheduler.running)
        check_invariants(scheduler)

    run_to_completion(scheduler, runner, max_steps=2000, result=result)
    assert_pool_whole(scheduler)
    for req_id, (prompt, max_tokens) in added.items():
        if req_id in aborted:
            continue
        assert result.finish_reasons[req_id] == "length"
        assert result.tokens[req_id] == expected_tokens(prompt, max_tokens)
