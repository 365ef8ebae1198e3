"""tests/v1/kv_connector/unit/* and the connector cases of tests/v1/core/test_scheduler.py:
how the scheduler asks a KV connector for external hits, and MultiConnector."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from strand.engine_core.connector.base import KVConnectorBase
from strand.engine_core.connector.multi import MultiConnector
from strand.engine_core.core.request import Request
from strand.engine_core.core.scheduler import Scheduler
from tests.engine_core.connector.conftest import DictTierConnector, RecordingConnector
from tests.engine_core.core.conftest import (
    FakeRunner,
    RunResult,
    assert_pool_whole,
    check_invariants,
    expected_tokens,
    make_request,
    make_scheduler,
)

PROMPT = list(range(100, 112))  # three blocks of 4


class AskedConnector(RecordingConnector):
    """Records the num_computed_tokens it is asked with."""

    def __init__(self, matched: int = 0) -> None:
        super().__init__(matched=matched)
        self.asked: list[tuple[str, int]] = []

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        self.asked.append((request.request_id, num_computed_tokens))
        return super().get_num_new_matched_tokens(request, num_computed_tokens)


def _with(connector: KVConnectorBase, **kwargs: object) -> Scheduler:
    return make_scheduler(connector=connector, **kwargs)  # type: ignore[arg-type]


def _run(scheduler: Scheduler, runner: FakeRunner, connector: KVConnectorBase) -> RunResult:
    result = RunResult()
    for _ in range(200):
        if not scheduler.has_unfinished_requests():
            return result
        out = scheduler.schedule()
        if out.kv_connector_metadata is not None:
            connector.start_load_kv(out.kv_connector_metadata, [])
        result.collect(scheduler.update_from_output(out, runner.execute(out)))
        check_invariants(scheduler)
    raise AssertionError("not finished")


@pytest.mark.parametrize("enable_prefix_caching", [True, False])
def test_kv_connector_basic(enable_prefix_caching: bool) -> None:
    scheduler = make_scheduler(enable_prefix_caching=enable_prefix_caching)
    runner = FakeRunner(scheduler)
    connector = DictTierConnector(runner)
    scheduler.connector = scheduler.kv_connector = connector
    scheduler.hash_blocks = True  # as Scheduler(connector=...) sets it
    scheduler.add_request(make_request("a", PROMPT + [1], max_tokens=2))
    _run(scheduler, runner, connector)
    scheduler.kv_cache_manager.block_pool.evict_cached_free_blocks()
    scheduler.add_request(make_request("b", PROMPT + [2], max_tokens=2))
    out = scheduler.schedule()
    # With or without automatic prefix caching, the tier supplies the three full blocks.
    assert out.scheduled_new_reqs[0].num_computed_tokens == 12
    assert out.num_scheduled_tokens == {"b": 1}
    connector.start_load_kv(out.kv_connector_metadata, [])
    result = RunResult()
    result.collect(scheduler.update_from_output(out, runner.execute(out)))
    result.tokens.setdefault("b", [])
    rest = _run(scheduler, runner, connector)
    assert result.tokens["b"] + rest.tokens.get("b", []) == expected_tokens(PROMPT + [2], 2)
    assert_pool_whole(scheduler)


def test_kv_connector_asked_with_the_local_hit() -> None:
    connector = AskedConnector()
    scheduler = _with(connector)
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("a", PROMPT + [1], max_tokens=1))
    _run(scheduler, runner, connector)
    scheduler.add_request(make_request("b", PROMPT + [2], max_tokens=1))
    _run(scheduler, runner, connector)
    assert connector.asked == [("a", 0), ("b", 12)]
    stats = scheduler.make_stats().connector_prefix_cache_stats
    assert stats is not None
    # Queried: the tokens the device cache did not hold (13 for a, 13 - 12 for b).
    assert (stats.requests, stats.queries, stats.hits) == (2, 14, 0)


def test_kv_connector_asked_without_prefix_caching() -> None:
    connector = AskedConnector()
    scheduler = _with(connector, enable_prefix_caching=False)
    runner = FakeRunner(scheduler)
    scheduler.add_request(make_request("a", PROMPT + [1], max_tokens=1))
    _run(scheduler, runner, connector)
    assert connector.asked == [("a", 0)]
    assert scheduler.make_stats().prefix_cache_stats.requests == 0  # device cache is off


def test_external_hits_are_taken_as_tokens() -> None:
    connector = AskedConnector(matched=6)  # not a block multiple
    scheduler = _with(connector)
    scheduler.add_request(make_request("a", PROMPT + [1], max_tokens=1))
    out = scheduler.schedule()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 6
    assert out.num_scheduled_tokens == {"a": 7}
    assert ("alloc", "a", 6) in connector.calls


def test_external_hits_leave_the_last_token_to_compute() -> None:
    connector = AskedConnector(matched=40)  # claims more than the prompt
    scheduler = _with(connector)
    scheduler.add_request(make_request("a", PROMPT, max_tokens=1))
    out = scheduler.schedule()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 11
    assert out.num_scheduled_tokens == {"a": 1}


def test_external_prefix_cache_metrics() -> None:
    connector = AskedConnector(matched=8)
    scheduler = _with(connector, enable_prefix_caching=False)
    for i in range(3):
        scheduler.add_request(make_request(str(i), 16, max_tokens=1))
    scheduler.schedule()
    stats = scheduler.make_stats().connector_prefix_cache_stats
    assert stats is not None
    assert (stats.requests, stats.queries, stats.hits) == (3, 48, 24)
    assert stats.hit_rate == 0.5


def test_kv_connector_unable_to_allocate() -> None:
    """No room for the blocks: the connector is not told to load, nothing is counted, and the
    request is admitted (asked again) once room frees up."""
    connector = AskedConnector(matched=8)
    scheduler = _with(connector, num_blocks=4, enable_prefix_caching=False)  # 3 blocks
    scheduler.add_request(make_request("blocker", 8, max_tokens=4))
    scheduler.schedule()  # blocker holds 2 of the 3 blocks
    scheduler.add_request(make_request("small", 12, max_tokens=1))
    out = scheduler.schedule()
    assert "small" not in out.num_scheduled_tokens  # 3 blocks needed, 1 free
    assert not any(c[0] == "alloc" and c[1] == "small" for c in connector.calls)
    stats = scheduler.make_stats().connector_prefix_cache_stats
    assert stats is not None and stats.requests == 1  # blocker only
    scheduler.finish_requests("blocker", scheduler.requests["blocker"].status.FINISHED_ABORTED)
    out = scheduler.schedule()
    assert out.scheduled_new_reqs[0].num_computed_tokens == 8
    assert ("alloc", "small", 8) in connector.calls
    stats = scheduler.make_stats().connector_prefix_cache_stats
    # blocker's 8-token claim was capped at 7 (its last token is computed), small took 8.
    assert stats is not None and (stats.requests, stats.hits) == (2, 15)


def test_kv_connector_handles_preemption() -> None:
    """A preempted request's computed blocks are offered to the connector, and on resume the
    tier's blocks are loaded instead of recomputed; output unchanged."""
    scheduler = make_scheduler(num_blocks=7, block_size=4)
    runner = FakeRunner(scheduler)
    connector = DictTierConnector(runner)
    scheduler.connector = scheduler.kv_connector = connector
    requests = [make_request(str(i), 9, max_tokens=6) for i in range(2)]
    for request in requests:
        scheduler.add_request(request)
    result = _run(scheduler, runner, connector)
    assert scheduler.num_preemptions > 0
    stats = scheduler.make_stats().connector_prefix_cache_stats
    assert stats is not None and stats.preempted_requests > 0
    for request in requests:
        assert result.tokens[request.request_id] == expected_tokens(request.prompt_token_ids, 6)
    assert_pool_whole(scheduler)


def test_lookup_kv_cache_asks_the_connector_without_prefix_caching() -> None:
    from strand.engine_core.core.kv_control import lookup_locations

    scheduler = _with(RecordingConnector(matched=8), enable_prefix_caching=False)
    assert lookup_locations(scheduler, list(range(20))) == {"device": 0, "cpu": 8}


# ---- MultiConnector (tests/v1/kv_connector/unit/test_multi_connector.py) -----------------

def test_multi_connector_asks_every_child() -> None:
    children = [AskedConnector(0), AskedConnector(8), AskedConnector(12)]
    multi = MultiConnector(children)
    request = make_request("r", 20)
    assert multi.get_num_new_matched_tokens(request, 4) == 8
    assert [c.asked for c in children] == [[("r", 4)]] * 3
    assert multi.loader_of("r") == 1
    multi.update_state_after_alloc(request, [1, 2, 3, 4, 5], 4, 8)
    assert [c.calls[-1] for c in children] == [("alloc", "r", 0), ("alloc", "r", 8),
                                               ("alloc", "r", 0)]
    assert multi.loader_of("r") is None


class _Broken(RecordingConnector):
    def reset_cache(self) -> bool | None:
        self.calls.append(("reset",))
        raise RuntimeError("tier unreachable")


@pytest.mark.parametrize(("answers", "expected"), [
    ((True, None, True), True), ((False, True, True), False), ((True, False, None), False),
])
def test_multi_connector_reset_cache(answers: Sequence[bool | None], expected: bool) -> None:
    children = [RecordingConnector(reset_answer=a) for a in answers]
    assert MultiConnector(children).reset_cache() is expected
    assert all(c.calls == [("reset",)] for c in children)


def test_multi_connector_reset_cache_after_an_exception() -> None:
    broken, after = _Broken(), RecordingConnector(reset_answer=True)
    assert MultiConnector([broken, after]).reset_cache() is False
    assert after.calls == [("reset",)]


def test_multi_connector_overrides_all_connector_methods() -> None:
    base_methods = {name for name, value in vars(KVConnectorBase).items()
                    if callable(value) and not name.startswith("_")}
    overridden = {name for name in vars(MultiConnector) if not name.startswith("_")}
    assert base_methods <= overridden


@pytest.mark.parametrize("name", [
    "test_remote_prefill_lifecycle", "test_remote_decode_lifecycle", "test_nixl_connector",
    "test_extra_async_saves", "test_multi_connector_stats",
])
def test_missing_features(name: str) -> None:
    missing = {
        "test_remote_prefill_lifecycle": "asynchronous (remote) KV loads, load_kv_async",
        "test_remote_decode_lifecycle": "disaggregated prefill/decode (kv_transfer_params)",
        "test_nixl_connector": "the NIXL connector",
        "test_extra_async_saves": "asynchronous KV saves (get_finished)",
        "test_multi_connector_stats": "per-connector KV transfer stats",
    }
    pytest.skip(f"missing feature: {missing[name]}")
