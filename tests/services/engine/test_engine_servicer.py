"""The engine servicer without a network: Session messages in, answers and the subscriber's
step outputs out."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from strand.engine_core.config import EngineArgs
from strand.engine_core.core.engine import EngineCore
from strand.engine_core.core.engine_io import EngineCoreOutput, EngineCoreRequest
from strand.engine_core.model_executor.model_runner import ModelRunner
from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services.common.convert import core_outputs_from_pb, core_request_to_pb
from strand.services.engine.servicer import EngineServicer


class RecordingSpan:
    def __init__(self) -> None:
        self.attributes: dict[str, Any] = {}

    def set_attribute(self, key: str, value: Any) -> None:
        self.attributes[key] = value


def _outputs(msg: epb.EngineStepOutputs) -> list[EngineCoreOutput]:
    return core_outputs_from_pb(msg.outputs).outputs


@pytest.fixture
def servicer(tiny_model_dir: Path) -> EngineServicer:
    import torch

    torch.set_num_threads(1)
    core = EngineCore.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                  kv_cache_memory=8 * 1024**2))
    return EngineServicer(core, "tiny")


def _add(servicer: EngineServicer, request_id: str, prompt: list[int],
         max_tokens: int = 1) -> None:
    request = EngineCoreRequest(request_id, prompt,
                                SamplingParams(temperature=0.0, max_tokens=max_tokens),
                                eos_token_id=None)
    resp = servicer.calls.handle(epb.EngineRequest(seq=1, add=epb.EngineAddRequests(
        requests=[core_request_to_pb(request)])), RecordingSpan())
    assert resp.WhichOneof("kind") == "state"


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bfloat16"])
def test_get_info_names_the_dtype_and_what_the_kv_cache_holds(tiny_model_dir: Path,
                                                              kv_cache_dtype: str) -> None:
    core = EngineCore.from_engine_args(EngineArgs(model=str(tiny_model_dir), dtype="float32",
                                                  kv_cache_memory=8 * 1024**2,
                                                  kv_cache_dtype=kv_cache_dtype))
    info = asyncio.run(EngineServicer(core, "tiny").GetInfo(epb.EngineInfoRequest(),
                                                            None))  # type: ignore[arg-type]
    assert (info.dtype, info.kv_cache_dtype) == (
        "float32", "float32" if kv_cache_dtype == "auto" else "bfloat16")
    core.shutdown()


def test_step_span_reports_the_scheduled_batch(servicer: EngineServicer) -> None:
    _add(servicer, "a", [1, 20, 21, 22, 23])
    _add(servicer, "b", [1, 30, 31])
    span = RecordingSpan()
    outputs = servicer.calls.step(span)
    assert [o.request_id for o in outputs.outputs] == ["a", "b"]
    assert span.attributes == {"strand.step.num_outputs": 2, "strand.step.batch_size": 2,
                               "strand.step.scheduled_tokens": 8,
                               "strand.step.prefill_tokens": 8}


def test_step_with_nothing_to_do_reports_an_empty_batch(servicer: EngineServicer) -> None:
    _add(servicer, "a", [1, 20, 21])
    servicer.calls.step(RecordingSpan())  # prefill; max_tokens=1 finishes it
    span = RecordingSpan()
    servicer.calls.step(span)
    assert span.attributes == {"strand.step.num_outputs": 0, "strand.step.batch_size": 0}


def test_the_runner_is_left_unwrapped(servicer: EngineServicer) -> None:
    # The step span reads EngineCore.last_scheduler_output instead of patching the runner.
    assert "execute_model" not in vars(servicer.core.runner)
    assert type(servicer.core.runner).execute_model is ModelRunner.execute_model


def test_lookup_and_clear_answer_in_their_own_kinds(servicer: EngineServicer) -> None:
    prompt = list(range(100, 140))
    _add(servicer, "a", prompt)
    servicer.calls.step(RecordingSpan())
    lookup = servicer.calls.handle(epb.EngineRequest(
        seq=2, lookup_kv_cache=epb.EngineLookupKvCache(token_ids=prompt)), RecordingSpan())
    assert dict(lookup.lookup.num_cached_tokens) == {"device": 32, "cpu": 0}
    cleared = servicer.calls.handle(epb.EngineRequest(
        seq=3, clear_kv_cache=epb.EngineClearKvCache(location="device")), RecordingSpan())
    assert cleared.seq == 3
    assert cleared.cleared.event_id.startswith("kv-clear-")
    assert cleared.cleared.num_tokens_cleared == 32


def test_a_query_names_the_asked_ids_the_engine_does_not_hold(servicer: EngineServicer) -> None:
    _add(servicer, "held", [1, 2, 3], max_tokens=5)
    _add(servicer, "aborted", [1, 2, 3], max_tokens=5)
    servicer.calls.handle(epb.EngineRequest(seq=2, abort=epb.EngineAbort(
        request_ids=["aborted"])), RecordingSpan())
    resp = servicer.calls.handle(epb.EngineRequest(seq=3, query=epb.EngineQuery(
        request_ids=["held", "aborted", "never"])), RecordingSpan())
    assert list(resp.state.missing_request_ids) == ["aborted", "never"]
    assert resp.state.num_unfinished_requests == 1


def test_get_loads_counts_running_waiting_and_blocks(servicer: EngineServicer) -> None:
    _add(servicer, "a", list(range(100, 140)), max_tokens=5)
    _add(servicer, "b", [1, 2, 3], max_tokens=5)
    before = servicer.calls.load()
    assert (before.num_running, before.num_waiting, before.kv_blocks_used) == (0, 2, 0)
    assert before.tokens_in_flight == 43
    servicer.calls.step(RecordingSpan())
    after = servicer.calls.load()
    assert (after.num_running, after.num_waiting) == (2, 0)
    assert after.kv_blocks_used == 3 + 1  # 41 tokens in 16-token blocks, and 4 in one
    assert after.kv_blocks_used + after.kv_blocks_free == servicer.core.num_blocks - 1


def test_unknown_location_is_an_in_stream_invalid_argument(servicer: EngineServicer) -> None:
    async def answer() -> epb.EngineResponse:
        return await servicer.answer(epb.EngineRequest(
            seq=4, clear_kv_cache=epb.EngineClearKvCache(location="tape")))

    resp = asyncio.run(answer())
    assert resp.seq == 4
    assert resp.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert resp.error.message.startswith("location")


async def _session(servicer: EngineServicer, messages: list[epb.EngineRequest],
                   subscribe: bool = True
                   ) -> tuple[list[epb.EngineResponse], list[epb.EngineStepOutputs]]:
    """Run a Session's messages with (or without) a subscriber reading the step outputs."""
    seen: list[epb.EngineStepOutputs] = []
    subscribed = asyncio.Event()

    async def subscriber() -> None:
        async for msg in servicer.Outputs(epb.EngineOutputsRequest(), None):  # type: ignore[arg-type]
            if msg.subscribed:
                subscribed.set()
            else:
                seen.append(msg)

    reader = asyncio.get_running_loop().create_task(subscriber()) if subscribe else None
    if reader is not None:
        await subscribed.wait()

    async def incoming():  # type: ignore[no-untyped-def]
        for message in messages:
            yield message
    answers = [resp async for resp in servicer.Session(incoming(), None)]  # type: ignore[arg-type]
    await asyncio.sleep(0.05)
    if reader is not None:
        reader.cancel()
    return answers, seen


def _add_msg(request_id: str, max_tokens: int) -> epb.EngineRequest:
    request = EngineCoreRequest(request_id, [1, 20, 21],
                                SamplingParams(temperature=0.0, max_tokens=max_tokens),
                                eos_token_id=None)
    return epb.EngineRequest(seq=1, add=epb.EngineAddRequests(
        requests=[core_request_to_pb(request)]))


def test_a_step_message_sends_its_outputs_to_the_subscriber_tagged_with_its_id(
        servicer: EngineServicer) -> None:
    messages = [_add_msg("a", 3), _add_msg("b", 1),
                epb.EngineRequest(seq=2, step=epb.EngineStep(step_id=7, origin="gw-1")),
                epb.EngineRequest(seq=3, step=epb.EngineStep(step_id=8, origin="gw-1"))]
    answers, seen = asyncio.run(_session(servicer, messages))
    assert [r.WhichOneof("kind") for r in answers] == ["state"] * 4
    assert [(m.step_id, m.origin) for m in seen] == [(7, "gw-1"), (8, "gw-1")]
    assert [o.request_id for o in _outputs(seen[0])] == ["a", "b"]
    assert [o.request_id for o in _outputs(seen[1])] == ["a"]
    assert answers[-1].state.num_unfinished_requests == 1


def test_without_a_subscriber_adds_and_steps_are_unavailable(servicer: EngineServicer) -> None:
    answers, _ = asyncio.run(_session(servicer, [
        _add_msg("a", 3), epb.EngineRequest(seq=2, step=epb.EngineStep(step_id=1))],
        subscribe=False))
    assert [r.error.code for r in answers] == [grpc.StatusCode.UNAVAILABLE.value[0]] * 2
    assert "no detokenizer is subscribed" in answers[0].error.message
    assert not servicer.core.has_unfinished_requests()


def test_losing_the_subscriber_aborts_every_request(servicer: EngineServicer) -> None:
    asyncio.run(_session(servicer, [_add_msg("a", 50), _add_msg("b", 50)]))
    servicer._executor.submit(lambda: None).result()  # the abort queued behind the adds
    assert servicer.core.get_num_unfinished_requests() == 0


def test_a_subscriber_lost_as_the_engine_stops_is_not_an_error(servicer: EngineServicer) -> None:
    # The stop closes the core's thread, then ends the Outputs stream: the abort it asked for
    # raised "cannot schedule new futures after shutdown" into gRPC's log on every stop.
    servicer.close()
    servicer._subscriber_lost()


async def _auto_stream(servicer: EngineServicer, on_subscribed: Callable[[], Awaitable[None]]
                       ) -> list[epb.EngineStepOutputs]:
    """Run the auto loop and read its step outputs until one finishes a request; on_subscribed
    sends the Session messages once the reader is subscribed."""
    loop_task = asyncio.get_running_loop().create_task(servicer.auto_loop())
    seen: list[epb.EngineStepOutputs] = []
    try:
        async for msg in servicer.Outputs(epb.EngineOutputsRequest(), None):  # type: ignore[arg-type]
            if msg.subscribed:
                await on_subscribed()
                continue
            seen.append(msg)
            if any(o.finished for o in _outputs(msg)):
                break
    finally:
        loop_task.cancel()
    return seen


def test_auto_mode_steps_by_itself_and_streams_each_step(tiny_model_dir: Path) -> None:
    import torch

    torch.set_num_threads(1)
    core = EngineCore.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                  kv_cache_memory=8 * 1024**2))
    servicer = EngineServicer(core, "tiny", auto_step=True)

    async def add() -> None:
        await servicer.answer(_add_msg("a", 4))

    seen = asyncio.run(_auto_stream(servicer, add))
    assert [m.step_id for m in seen] == [0, 0, 0, 0]
    assert [len(_outputs(m)[0].new_token_ids) for m in seen] == [1, 1, 1, 1]
    servicer.close()


class SubmitLog(ThreadPoolExecutor):
    """One thread, as the core's, that tells which functions were submitted to it."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.names: list[str] = []
        self.changed = threading.Condition()

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        with self.changed:
            self.names.append(getattr(fn, "__name__", repr(fn)))
            self.changed.notify_all()
        return super().submit(fn, *args, **kwargs)


def test_a_lone_adds_step_is_queued_behind_it_before_the_add_returns(
        tiny_model_dir: Path) -> None:
    """The add's answer need not come back through the event loop before its step starts: while
    the add runs on the core's thread, the step is already waiting behind it."""
    import torch

    torch.set_num_threads(1)
    executor = SubmitLog()
    core = executor.submit(EngineCore.from_engine_args, EngineArgs(
        model=str(tiny_model_dir), kv_cache_memory=8 * 1024**2)).result()
    servicer = EngineServicer(core, "tiny", executor=executor, auto_step=True)
    handle = servicer.calls.handle
    step_queued_during_add: list[bool] = []

    def add_waiting_for_its_step(msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        with executor.changed:  # bounded: the old order would time out here, and fail below
            step_queued_during_add.append(executor.changed.wait_for(
                lambda: "_auto_steps" in executor.names, timeout=5.0))
        return handle(msg, span)
    servicer.calls.handle = add_waiting_for_its_step  # type: ignore[method-assign]

    async def add() -> None:
        answer = await servicer.answer(_add_msg("a", 2))
        assert answer.WhichOneof("kind") == "state"

    try:
        seen = asyncio.run(asyncio.wait_for(_auto_stream(servicer, add), 60))
    finally:
        servicer.close()
    assert step_queued_during_add == [True]
    assert [len(_outputs(m)[0].new_token_ids) for m in seen] == [1, 1]


def test_messages_that_come_while_the_core_is_busy_are_all_queued_on_it_in_order(
        tiny_model_dir: Path) -> None:
    """A burst of adds that arrives during a step is in before the next step: the Session does
    not wait for one answer before it reads the next message."""
    import torch

    torch.set_num_threads(1)
    executor = SubmitLog()
    core = executor.submit(EngineCore.from_engine_args, EngineArgs(
        model=str(tiny_model_dir), kv_cache_memory=8 * 1024**2)).result()
    servicer = EngineServicer(core, "tiny", executor=executor)
    busy = threading.Event()
    order: list[str] = []
    handle = servicer.calls.handle

    def recording(msg: epb.EngineRequest, span: Any) -> epb.EngineResponse:
        kind = msg.WhichOneof("kind")
        order.append(msg.add.requests[0].request_id if kind == "add" else kind or "")
        return handle(msg, span)
    servicer.calls.handle = recording  # type: ignore[method-assign]
    messages = [_add_msg(name, 1) for name in "abc"]
    messages.append(epb.EngineRequest(seq=9, abort=epb.EngineAbort(request_ids=["b"])))

    async def run() -> tuple[list[epb.EngineResponse], int]:
        executor.submit(busy.wait, 30.0)  # the core's thread is taken, as by a long step
        session = asyncio.get_running_loop().create_task(_session(servicer, messages))
        queued = 0
        for _ in range(500):  # bounded: the old one-at-a-time reading never queues a second
            await asyncio.sleep(0.01)
            queued = executor.names.count("_begin")  # each Session call, counted
            if queued == len(messages):
                break
        busy.set()
        answers, _ = await session
        return answers, queued

    try:
        answers, queued = asyncio.run(asyncio.wait_for(run(), 60))
    finally:
        busy.set()
        servicer.close()
    assert queued == len(messages)
    assert order == ["a", "b", "c", "abort"]
    assert [r.WhichOneof("kind") for r in answers] == ["state"] * 4
    # Each answer counts the core as its call left it: three adds, then the abort of one.
    assert [r.state.num_unfinished_requests for r in answers] == [1, 2, 3, 2]


def _auto_servicer(tiny_model_dir: Path, back_to_back_min_s: float = 0.0
                   ) -> tuple[EngineServicer, SubmitLog, list[int]]:
    """An auto-stepping servicer whose thread logs what it is given; the list counts steps.
    The tiny model's steps are short: back to back only with the threshold at 0."""
    import torch

    torch.set_num_threads(1)
    executor = SubmitLog()
    core = executor.submit(EngineCore.from_engine_args, EngineArgs(
        model=str(tiny_model_dir), kv_cache_memory=8 * 1024**2)).result()
    servicer = EngineServicer(core, "tiny", executor=executor, auto_step=True,
                              back_to_back_min_s=back_to_back_min_s)
    steps: list[int] = []
    step = servicer.calls.step

    def counting(span: Any) -> Any:
        steps.append(1)
        outputs = step(span)
        # A real step's torch calls leave the GIL to the event loop for milliseconds (it sends
        # the last step's message meanwhile); the tiny model's Python-only steps barely would.
        time.sleep(0.005)
        return outputs
    servicer.calls.step = counting  # type: ignore[method-assign]
    return servicer, executor, steps


@pytest.mark.parametrize("back_to_back_min_s", [0.0, 60.0])
def test_auto_steps_run_back_to_back_on_the_core_thread_while_nothing_else_waits(
        tiny_model_dir: Path, back_to_back_min_s: float) -> None:
    """Eight steps of one request without giving the thread back to the event loop between them
    (each hand-back costs two thread wake-ups), every step's message still streamed in order;
    steps shorter than the threshold hand the thread back after each step instead."""
    servicer, executor, steps = _auto_servicer(tiny_model_dir, back_to_back_min_s)

    async def add() -> None:
        await servicer.answer(_add_msg("a", 8))

    try:
        seen = asyncio.run(asyncio.wait_for(_auto_stream(servicer, add), 60))
    finally:
        servicer.close()
    assert len(seen) == len(steps) == 8
    assert [len(_outputs(m)[0].new_token_ids) for m in seen] == [1] * 8
    hand_overs = executor.names.count("_auto_steps")
    if back_to_back_min_s == 0.0:
        # The subscriber read each message at once, so nothing held the thread back: a hand-over
        # or two (the first may end while the add's answer is still on its way), never 8.
        assert 1 <= hand_overs <= 3
    else:
        assert hand_overs == 8


def test_a_detokenizer_that_stops_reading_stops_the_engine_a_few_steps_ahead(
        tiny_model_dir: Path) -> None:
    servicer, _, steps = _auto_servicer(tiny_model_dir)

    async def run() -> tuple[int, int]:
        loop_task = asyncio.get_running_loop().create_task(servicer.auto_loop())
        stream = servicer.Outputs(epb.EngineOutputsRequest(), None)  # type: ignore[arg-type]
        assert (await anext(stream)).subscribed
        await servicer.answer(_add_msg("a", 40))
        await asyncio.sleep(1.0)  # nobody reads: the hub fills, the engine must wait
        stalled = len(steps)
        read = 0
        async for msg in stream:  # reading again lets it finish
            read += 1
            if any(o.finished for o in _outputs(msg)):
                break
        loop_task.cancel()
        return stalled, read

    try:
        stalled, read = asyncio.run(asyncio.wait_for(run(), 60))
    finally:
        servicer.close()
    # Two steps in the hub's queue, one put waiting for room, one message on its way to the loop.
    assert 2 <= stalled <= 5
    assert read == len(steps) == 40


def test_an_add_that_fails_leaves_the_auto_loop_stepping_nothing(tiny_model_dir: Path) -> None:
    import torch

    torch.set_num_threads(1)
    core = EngineCore.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                  kv_cache_memory=8 * 1024**2))
    servicer = EngineServicer(core, "tiny", auto_step=True)
    too_long = EngineCoreRequest("x", [1] * 100_000, SamplingParams(max_tokens=1),
                                 eos_token_id=None)
    bad = epb.EngineRequest(seq=1, add=epb.EngineAddRequests(requests=[core_request_to_pb(
        too_long)]))

    answers: list[epb.EngineResponse] = []

    async def adds() -> None:
        answers.append(await servicer.answer(bad))
        await servicer.answer(_add_msg("ok", 1))  # a good add still runs after it

    try:
        # Bounded: a lost wake-up (the add's work forgotten) would leave the stream waiting.
        seen = asyncio.run(asyncio.wait_for(_auto_stream(servicer, adds), 60))
    finally:
        servicer.close()
    assert answers[0].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert [[o.request_id for o in _outputs(m)] for m in seen] == [["ok"]]
    assert not core.has_unfinished_requests()


def test_the_model_loads_on_the_thread_that_runs_every_step(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A second thread running torch leaves a second OpenMP team behind, and libgomp then stops
    # spin-waiting in every parallel region of every step (see strand/services/engine/servicer.py).
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
    messages = [_add_msg("a", 2), epb.EngineRequest(seq=2, step=epb.EngineStep(step_id=1)),
                epb.EngineRequest(seq=3, step=epb.EngineStep(step_id=2))]
    try:
        _, seen = asyncio.run(_session(servicer, messages))
    finally:
        servicer.close()
    assert sum(len(_outputs(m)) for m in seen) == 2
    assert len(threads["load"]) == 1 and threads["load"] == threads["step"]
    assert threads["load"] != {threading.get_ident()}


def test_log_stats_prints_the_periodic_line_in_the_engine_service(
        servicer: EngineServicer, caplog: pytest.LogCaptureFixture) -> None:
    from strand.engine_core.stats_logger import StatsLogger

    servicer.calls.stats_logger = StatsLogger(interval_s=0.0)  # every step
    _add(servicer, "a", [1, 20, 21, 22, 23])
    _add(servicer, "b", [1, 30, 31])
    with caplog.at_level("INFO", logger="strand.stats"):
        servicer.calls.step(RecordingSpan())
    lines = [r.getMessage() for r in caplog.records if r.name == "strand.stats"]
    assert len(lines) == 1
    assert lines[0].startswith("Avg prompt throughput: ")
    assert "Running: 0 reqs, Waiting: 0 reqs" in lines[0]  # both had max_tokens=1
    assert "KV cache usage: 0.0%" in lines[0] and "Prefix cache hit rate: 0.0%" in lines[0]
    prompt_tps = float(lines[0].split("Avg prompt throughput: ")[1].split()[0])
    assert prompt_tps > 0.0  # 8 prompt tokens in this interval
