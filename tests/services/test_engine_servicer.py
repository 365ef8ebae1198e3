"""The engine servicer without a network: one EngineRequest in, one EngineResponse out."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from engine_core.config import EngineArgs
from engine_core.core.engine_io import EngineCoreRequest
from engine_core.engine_core import EngineCore
from engine_core.model_executor.model_runner import ModelRunner
from engine_core.sampling_params import SamplingParams
from services._proto.strand.v1 import engine_pb2 as epb
from services.common.convert import core_request_to_pb
from services.engine.servicer import EngineServicer


class RecordingSpan:
    def __init__(self) -> None:
        self.attributes: dict[str, Any] = {}

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value


@pytest.fixture
def servicer(tiny_model_dir: Path) -> EngineServicer:
    import torch

    torch.set_num_threads(1)
    core = EngineCore.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                  kv_cache_memory=8 * 1024**2))
    return EngineServicer(core, "tiny")


def _add(servicer: EngineServicer, request_id: str, prompt: list[int]) -> None:
    request = EngineCoreRequest(request_id, prompt, SamplingParams(temperature=0.0, max_tokens=1),
                                eos_token_id=None)
    resp = servicer.handle(epb.EngineRequest(seq=1, add=epb.EngineAddRequests(
        requests=[core_request_to_pb(request)])))
    assert resp.WhichOneof("kind") == "state"


def test_step_span_reports_the_scheduled_batch(servicer: EngineServicer) -> None:
    _add(servicer, "a", [1, 20, 21, 22, 23])
    _add(servicer, "b", [1, 30, 31])
    span = RecordingSpan()
    resp = servicer._step(7, span, 1)
    assert resp.seq == 7
    assert [o.request_id for o in resp.outputs.outputs] == ["a", "b"]
    assert span.attributes == {"strand.step.num_steps": 1,
                               "strand.step.num_outputs": 2, "strand.step.batch_size": 2,
                               "strand.step.scheduled_tokens": 8,
                               "strand.step.prefill_tokens": 8}


def test_step_with_nothing_to_do_reports_an_empty_batch(servicer: EngineServicer) -> None:
    _add(servicer, "a", [1, 20, 21])
    servicer._step(1, RecordingSpan(), 1)  # prefill; max_tokens=1 finishes it
    span = RecordingSpan()
    servicer._step(2, span, 1)
    assert span.attributes == {"strand.step.num_steps": 1, "strand.step.num_outputs": 0,
                               "strand.step.batch_size": 0}


def test_the_runner_is_left_unwrapped(servicer: EngineServicer) -> None:
    # The step span reads EngineCore.last_scheduler_output instead of patching the runner.
    assert "execute_model" not in vars(servicer.core.runner)
    assert type(servicer.core.runner).execute_model is ModelRunner.execute_model


def test_lookup_and_clear_answer_in_their_own_kinds(servicer: EngineServicer) -> None:
    prompt = list(range(100, 140))
    _add(servicer, "a", prompt)
    servicer._step(1, RecordingSpan())
    lookup = servicer.handle(epb.EngineRequest(
        seq=2, lookup_kv_cache=epb.EngineLookupKvCache(token_ids=prompt)))
    assert dict(lookup.lookup.num_cached_tokens) == {"device": 32, "cpu": 0}
    cleared = servicer.handle(epb.EngineRequest(
        seq=3, clear_kv_cache=epb.EngineClearKvCache(location="device")))
    assert cleared.seq == 3
    assert cleared.cleared.event_id.startswith("kv-clear-")
    assert cleared.cleared.num_tokens_cleared == 32


def test_unknown_location_is_an_in_stream_invalid_argument(servicer: EngineServicer) -> None:
    resp = servicer.handle(epb.EngineRequest(
        seq=4, clear_kv_cache=epb.EngineClearKvCache(location="tape")))
    assert resp.seq == 4
    assert resp.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert resp.error.message.startswith("location")


def test_the_model_loads_on_the_thread_that_runs_every_step(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A second thread running torch leaves a second OpenMP team behind, and libgomp then stops
    # spin-waiting in every parallel region of every step (see services/engine/servicer.py).
    import asyncio
    import threading

    threads: dict[str, set[int]] = {"load": set(), "step": set()}
    load, step = EngineCore.from_engine_args, EngineCore.step

    def recording_load(args: EngineArgs) -> EngineCore:
        threads["load"].add(threading.get_ident())
        return load(args)

    def recording_step(core: EngineCore) -> Any:
        threads["step"].add(threading.get_ident())
        return step(core)

    monkeypatch.setattr(EngineCore, "from_engine_args", staticmethod(recording_load))
    monkeypatch.setattr(EngineCore, "step", recording_step)
    servicer = EngineServicer.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                          kv_cache_memory=8 * 1024**2))
    request = EngineCoreRequest("a", [1, 2, 3], SamplingParams(temperature=0.0, max_tokens=2),
                                eos_token_id=None)
    messages = [epb.EngineRequest(seq=1, add=epb.EngineAddRequests(
                    requests=[core_request_to_pb(request)])),
                epb.EngineRequest(seq=2, step=epb.EngineStep()),
                epb.EngineRequest(seq=3, step=epb.EngineStep())]

    async def session() -> list[epb.EngineResponse]:
        async def incoming():  # type: ignore[no-untyped-def]
            for message in messages:
                yield message
        return [resp async for resp in servicer.Session(incoming(), None)]  # type: ignore[arg-type]

    try:
        responses = asyncio.run(session())
    finally:
        servicer.close()
    assert [r.seq for r in responses] == [1, 2, 3]
    assert sum(len(r.outputs.outputs) for r in responses[1:]) == 2
    assert len(threads["load"]) == 1 and threads["load"] == threads["step"]
    assert threads["load"] != {threading.get_ident()}



def test_one_step_message_runs_num_steps_and_answers_them_in_order(
        servicer: EngineServicer) -> None:
    def add(request_id: str, max_tokens: int) -> None:
        request = EngineCoreRequest(request_id, [1, 20, 21],
                                    SamplingParams(temperature=0.0, max_tokens=max_tokens),
                                    eos_token_id=None)
        servicer.handle(epb.EngineRequest(seq=1, add=epb.EngineAddRequests(
            requests=[core_request_to_pb(request)])))

    add("a", 5)
    add("b", 2)
    resp = servicer.handle(epb.EngineRequest(seq=2, step=epb.EngineStep(num_steps=3)))
    outputs = [(o.request_id, len(o.new_token_ids), o.HasField("finish_reason"))
               for o in resp.outputs.outputs]
    # Three steps: a and b, a and b (b ends at 2 tokens), then a alone.
    assert outputs == [("a", 1, False), ("b", 1, False), ("a", 1, False), ("b", 1, True),
                       ("a", 1, False)]
    assert list(resp.outputs.finished_requests) == ["b"]
    # Stops early once nothing is left: a needs 2 more steps of the 10 asked.
    resp = servicer.handle(epb.EngineRequest(seq=3, step=epb.EngineStep(num_steps=10)))
    assert [(o.request_id, o.HasField("finish_reason")) for o in resp.outputs.outputs] == [
        ("a", False), ("a", True)]
    assert not servicer.core.has_unfinished_requests()


def test_too_many_steps_in_one_message_is_an_in_stream_invalid_argument(
        servicer: EngineServicer) -> None:
    from services.engine.servicer import MAX_STEPS_PER_CALL

    resp = servicer.handle(epb.EngineRequest(
        seq=4, step=epb.EngineStep(num_steps=MAX_STEPS_PER_CALL + 1)))
    assert resp.WhichOneof("kind") == "error"
    assert resp.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert f"num_steps must be <= {MAX_STEPS_PER_CALL}" in resp.error.message


def test_log_stats_prints_the_periodic_line_in_the_engine_service(
        servicer: EngineServicer, caplog: pytest.LogCaptureFixture) -> None:
    from engine_core.stats_logger import StatsLogger

    servicer.stats_logger = StatsLogger(interval_s=0.0)  # every step: --stats-interval-s 0
    _add(servicer, "a", [1, 20, 21, 22, 23])
    _add(servicer, "b", [1, 30, 31])
    with caplog.at_level("INFO", logger="strand.stats"):
        servicer._step(1, RecordingSpan(), 1)
    lines = [r.getMessage() for r in caplog.records if r.name == "strand.stats"]
    assert len(lines) == 1
    assert lines[0].startswith("Avg prompt throughput: ")
    assert "Running: 0 reqs, Waiting: 0 reqs" in lines[0]  # both had max_tokens=1
    assert "KV cache usage: 0.0%" in lines[0] and "Prefix cache hit rate: 0.0%" in lines[0]
    prompt_tps = float(lines[0].split("Avg prompt throughput: ")[1].split()[0])
    assert prompt_tps > 0.0  # 8 prompt tokens in this interval
