"""The step after a first token on one thread fewer (strand/services/engine/spare_core.py): exactly
that one decode step, at low load, where the engine fills the CPUs; tokens as without it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from strand.engine_core.config import EngineArgs
from strand.engine_core.core.engine import EngineCore
from strand.engine_core.core.engine_io import EngineCoreOutput, EngineCoreOutputs
from strand.services.engine.servicer import EngineServicer
from strand.services.engine.spare_core import LOW_LOAD_REQUESTS, SpareCore, fills_cpus
from tests.services.engine.test_engine_servicer import _add_msg, _auto_stream, _outputs


@pytest.fixture
def threads_restored() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _first(request_id: str = "r") -> EngineCoreOutputs:
    return EngineCoreOutputs(outputs=[EngineCoreOutput(request_id, [7],
                                                       first_scheduled_time=1.0)])


def _later(request_id: str = "r") -> EngineCoreOutputs:
    return EngineCoreOutputs(outputs=[EngineCoreOutput(request_id, [8])])


def test_only_the_decode_step_after_a_first_token_runs_on_one_thread_fewer(
        threads_restored: None) -> None:
    torch.set_num_threads(2)
    spare = SpareCore(2, enabled=True)
    seen: list[int] = []
    asked: list[int] = []

    def decodes_only() -> bool:
        asked.append(len(seen))
        return True
    for outputs in (_first(), _later(), _later()):
        spare.before_step(decodes_only)
        seen.append(torch.get_num_threads())
        spare.restore()
        spare.after_step(outputs, short=True, num_unfinished=1)
    spare.before_step(decodes_only)
    seen.append(torch.get_num_threads())
    assert seen == [2, 1, 2, 2]
    assert asked == [1]  # the running requests are looked at only after a first token
    spare.restore()
    assert torch.get_num_threads() == 2  # between steps, every thread


def test_a_step_that_fails_gives_its_threads_back(threads_restored: None) -> None:
    torch.set_num_threads(2)
    spare = SpareCore(2, enabled=True)
    spare.after_step(_first(), short=True, num_unfinished=1)
    spare.before_step(lambda: True)
    assert torch.get_num_threads() == 1
    spare.restore()  # the servicer's finally, whatever the step raised
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize(("short", "num_unfinished", "decodes_only", "enabled"), [
    (False, 1, True, True),  # a long step: a large batch
    (True, LOW_LOAD_REQUESTS + 1, True, True),  # more requests than low load
    (True, 1, False, True),  # the next step prefills: its request's TTFT needs every thread
    (True, 1, True, False),  # turned off (--spare-core off, or the CPUs are not all taken)
])
def test_no_thread_is_spared_beyond_low_load_decode_steps(
        threads_restored: None, short: bool, num_unfinished: int, decodes_only: bool,
        enabled: bool) -> None:
    torch.set_num_threads(2)
    spare = SpareCore(2, enabled=enabled)
    spare.after_step(_first(), short=short, num_unfinished=num_unfinished)
    spare.before_step(lambda: decodes_only)
    assert torch.get_num_threads() == 2


def test_a_step_with_only_later_tokens_spares_nothing(threads_restored: None) -> None:
    torch.set_num_threads(2)
    spare = SpareCore(2, enabled=True)
    prompt_logprobs_only = EngineCoreOutputs(outputs=[EngineCoreOutput(
        "r", [], first_scheduled_time=1.0)])  # a chunk's prompt logprobs: no token yet
    for outputs in (_later(), prompt_logprobs_only):
        spare.after_step(outputs, short=True, num_unfinished=1)
        spare.before_step(lambda: True)
        assert torch.get_num_threads() == 2


def test_the_engine_fills_the_cpus_only_on_cpu_with_a_thread_for_each() -> None:
    cpus = len(os.sched_getaffinity(0))
    assert fills_cpus("cpu", cpus, 1) == (cpus > 1)
    assert not fills_cpus("cpu", cpus - 1, 1)
    assert not fills_cpus("cuda", cpus, 1)
    assert not fills_cpus("cpu", cpus, 2)  # tensor-parallel ranks: threads in other processes


def test_auto_mode_spares_a_thread_for_the_step_after_the_first_token_and_keeps_the_tokens(
        tiny_model_dir: Path, threads_restored: None) -> None:
    torch.set_num_threads(2)
    counts: list[int] = []
    streams = {}
    for spare_core in (True, False):
        core = EngineCore.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                      kv_cache_memory=8 * 1024**2))
        servicer = EngineServicer(core, "tiny", auto_step=True, num_threads=2,
                                  spare_core=spare_core)
        step = servicer.calls.step

        def counted(span, step=step):  # type: ignore[no-untyped-def]
            counts.append(torch.get_num_threads())
            return step(span)
        servicer.calls.step = counted  # type: ignore[method-assign]

        async def add(servicer: EngineServicer = servicer) -> None:
            await servicer.answer(_add_msg("a", 4))
        counts.clear()
        seen = asyncio.run(asyncio.wait_for(_auto_stream(servicer, add), 60))
        idle_threads = servicer.thread.submit(torch.get_num_threads).result()
        servicer.close()
        assert idle_threads == 2  # between steps the core's thread has all of them
        streams[spare_core] = [t for m in seen for t in _outputs(m)[0].new_token_ids]
        if spare_core:
            assert counts == [2, 1, 2, 2]  # prefill, the step after its token, the rest
        else:
            assert counts == [2, 2, 2, 2]
    assert streams[True] == streams[False] and len(streams[True]) == 4
