"""The engine drops requests nobody waits for: past their deadline (queued or running) at its
next step, and with max_queue_time those that waited too long for their first step; each ends
with finish_reason "abort" and says why."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from strand.engine_core import EngineArgs
from strand.engine_core.core.engine import EngineCore
from strand.engine_core.core.engine_io import EngineCoreOutput, EngineCoreRequest
from strand.engine_core.core.expiry import DEADLINE_REASON, QUEUE_TIME_REASON
from strand.engine_core.sampling_params import SamplingParams

PROMPT = [5, 17, 42, 99, 7, 3, 250, 11]


def make_core(model_dir: Path, **overrides: object) -> EngineCore:
    return EngineCore.from_engine_args(EngineArgs(
        model=str(model_dir), dtype="float32", device="cpu", num_gpu_blocks_override=64,
        max_model_len=128, **overrides))  # type: ignore[arg-type]


def make_request(deadline: float | None = None, arrival_time: float | None = None,
                 max_tokens: int = 50) -> EngineCoreRequest:
    return EngineCoreRequest(request_id=str(uuid.uuid4()), prompt_token_ids=list(PROMPT),
                             sampling_params=SamplingParams(max_tokens=max_tokens,
                                                            ignore_eos=True),
                             eos_token_id=None,
                             arrival_time=time.time() if arrival_time is None else arrival_time,
                             deadline=deadline)


def finished(outputs: list[EngineCoreOutput]) -> dict[str, tuple[str | None, object]]:
    return {o.request_id: (o.finish_reason, o.stop_reason) for o in outputs if o.finished}


@pytest.fixture(scope="module")
def core(tiny_model_dir: Path) -> EngineCore:
    return make_core(tiny_model_dir)


def test_a_queued_request_past_its_deadline_ends_with_abort_at_the_next_step(
        core: EngineCore) -> None:
    late = make_request(deadline=time.time() - 0.001)
    core.add_request(late)
    out = core.step()
    assert finished(out.outputs) == {late.request_id: ("abort", DEADLINE_REASON)}
    assert core.get_num_unfinished_requests() == 0
    assert core.reset_prefix_cache()


def test_a_running_request_is_dropped_once_its_deadline_passes(core: EngineCore) -> None:
    request = make_request(deadline=time.time() + 0.3)
    other = make_request()
    core.add_request(request)
    core.add_request(other)
    core.step()
    assert request.request_id in {r.request_id for r in core.scheduler.running}
    time.sleep(0.35)
    out = core.step()
    assert finished(out.outputs) == {request.request_id: ("abort", DEADLINE_REASON)}
    assert core.get_num_unfinished_requests() == 1  # the other runs on
    core.abort_requests([other.request_id])
    core.step()


def test_no_deadline_means_no_expiry(core: EngineCore) -> None:
    request = make_request(max_tokens=3)
    core.add_request(request)
    reasons = {}
    for _ in range(10):
        reasons.update(finished(core.step().outputs))
    assert reasons == {request.request_id: ("length", None)}


def test_max_queue_time_aborts_a_request_that_waited_too_long(tiny_model_dir: Path) -> None:
    core = make_core(tiny_model_dir, max_queue_time=0.5)
    stale = make_request(arrival_time=time.time() - 1.0)
    fresh = make_request(max_tokens=2)
    core.add_request(stale)
    core.add_request(fresh)
    out = core.step()
    assert finished(out.outputs) == {stale.request_id: ("abort", QUEUE_TIME_REASON)}
    assert [r.request_id for r in core.scheduler.running] == [fresh.request_id]


def test_max_queue_time_spares_a_request_already_running(tiny_model_dir: Path) -> None:
    core = make_core(tiny_model_dir, max_queue_time=0.2)
    request = make_request(max_tokens=40)
    core.add_request(request)
    core.step()
    time.sleep(0.25)
    out = core.step()
    assert request.request_id not in finished(out.outputs)
    core.abort_requests([request.request_id])


def test_max_queue_time_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_queue_time must be > 0"):
        EngineArgs(model="m", max_queue_time=0.0)


def test_with_a_batch_queue_expired_requests_end_too(tiny_model_dir: Path) -> None:
    core = make_core(tiny_model_dir, max_concurrent_batches=2)
    running = make_request(deadline=time.time() + 0.3)
    late = make_request(deadline=time.time() - 0.001)
    core.add_request(running)
    core.add_request(late)
    ends: dict[str, tuple[str | None, object]] = {}
    stop = time.monotonic() + 30
    while core.get_num_unfinished_requests() and time.monotonic() < stop:
        ends.update(finished(core.step_with_batch_queue().outputs))
        time.sleep(0.01)
    assert ends == {late.request_id: ("abort", DEADLINE_REASON),
                    running.request_id: ("abort", DEADLINE_REASON)}
    # Nothing is left in flight or in the cache: the queue drains and the reset succeeds.
    while core.batch_queue is not None and len(core.batch_queue):
        core.step_with_batch_queue()
    assert core.reset_prefix_cache()
