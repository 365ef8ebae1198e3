"""The engine's OpenMP team spread one thread per CPU for the first step after idle
(cpu_binding.py says why), each test in a thread of its own so the test process's threads keep
their CPUs."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch

from strand.engine_core.config import EngineArgs
from strand.engine_core.sampling_params import SamplingParams
from strand.platform import cpu_binding

CPUS = sorted(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="spreading needs two CPUs")
T = TypeVar("T")


def _in_thread(fn: Callable[[], Any], threads: int = 2) -> Any:
    """fn on a new thread with a torch team of `threads`; its result."""
    box: dict[str, Any] = {}

    def run() -> None:
        torch.set_num_threads(threads)
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised on the test's thread
            box["error"] = exc
    own = torch.get_num_threads()
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    torch.set_num_threads(own)
    if "error" in box:
        raise box["error"]
    return box["result"]


def _built_with_two_threads(build: Callable[[], T]) -> T:
    """build() with a torch team of two, this thread's count restored after."""
    own = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        return build()
    finally:
        torch.set_num_threads(own)


def _recorded_placements(core: Any) -> list[set[int]]:
    """The CPUs each of the core's steps ran its model on, from now on."""
    placements: list[set[int]] = []
    execute = core.runner.execute_model

    def recording(scheduler_output: Any) -> Any:
        placements.append(os.sched_getaffinity(0))
        return execute(scheduler_output)
    core.runner.execute_model = recording
    return placements


@needs_two_cpus
def test_the_team_is_on_one_cpu_each_while_spread_and_floats_after() -> None:
    a = torch.randn(256, 256)

    def body() -> dict[str, Any]:
        spread = cpu_binding.team_spread()
        assert spread is not None
        seen: dict[str, Any] = {"ids": spread.thread_ids, "cpus": spread.cpus,
                                "me": threading.get_native_id()}
        with spread:
            seen["inside"] = [os.sched_getaffinity(tid) for tid in spread.thread_ids]
            seen["product"] = a @ a
        seen["after"] = [os.sched_getaffinity(tid) for tid in spread.thread_ids]
        return seen

    seen = _in_thread(body)
    assert seen["cpus"] == CPUS[:2]
    assert seen["ids"][0] == seen["me"] and len(set(seen["ids"])) == 2  # the caller and a worker
    assert seen["inside"] == [{CPUS[0]}, {CPUS[1]}]
    torch.testing.assert_close(seen["product"], a @ a)  # the spread team still computes
    assert seen["after"] == [set(CPUS), set(CPUS)]


@pytest.mark.parametrize("env", [{"STRAND_CPU_BIND": "off"}, {"OMP_PROC_BIND": "close"},
                                 {"GOMP_CPU_AFFINITY": "0-1"}])
def test_the_users_choice_leaves_placement_to_the_kernel(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _in_thread(cpu_binding.team_spread) is None


def test_fewer_allowed_cpus_than_threads_or_one_thread_spreads_nothing() -> None:
    def on_one_cpu() -> cpu_binding.TeamSpread | None:
        os.sched_setaffinity(0, {CPUS[0]})  # this thread only: it ends with the test
        return cpu_binding.team_spread()
    assert _in_thread(on_one_cpu) is None
    assert _in_thread(cpu_binding.team_spread, threads=1) is None


def test_an_unknown_mode_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRAND_CPU_BIND", "yes")
    with pytest.raises(ValueError, match="STRAND_CPU_BIND must be one of auto, off, got 'yes'"):
        cpu_binding.team_spread()


@needs_two_cpus
def test_only_the_first_step_after_idle_runs_spread(tiny_model_dir: Path) -> None:
    from strand.engine_core.core.engine import EngineCore

    def body() -> list[set[int]]:
        core = EngineCore.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                      kv_cache_memory=8 * 1024**2))
        placements = _recorded_placements(core)
        try:
            assert core.spread_team_after_idle()
            params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
            for name in ("a", "b"):  # two requests, one after the other: two idle gaps
                core.add_request(_request(core, name, params))
                while core.has_unfinished_requests():
                    core.step()
        finally:
            core.shutdown()
        return placements

    placements = _in_thread(body)
    # Three steps a request (the prompt, then two decodes); the first of each on one CPU.
    assert placements == [{CPUS[0]}, set(CPUS), set(CPUS)] * 2


def test_with_a_batch_queue_nothing_is_spread(tiny_model_dir: Path) -> None:
    from strand.engine_core.core.engine import EngineCore

    def body() -> bool:
        core = EngineCore.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                      kv_cache_memory=8 * 1024**2,
                                                      max_concurrent_batches=2))
        try:
            return core.spread_team_after_idle()
        finally:
            core.shutdown()
    assert _in_thread(body) is False


@needs_two_cpus
def test_the_engine_stage_spreads_its_core_threads_team(tiny_model_dir: Path) -> None:
    from strand.services.engine.servicer import EngineServicer

    servicer = _built_with_two_threads(lambda: EngineServicer.from_engine_args(EngineArgs(
        model=str(tiny_model_dir), kv_cache_memory=8 * 1024**2)))
    try:
        spread = servicer.core._team_spread
        assert spread is not None and spread.cpus == CPUS[:2]
        core_thread = servicer.thread.submit(threading.get_native_id).result()
        assert spread.thread_ids[0] == core_thread
        # At rest every thread floats.
        assert all(os.sched_getaffinity(tid) == set(CPUS) for tid in spread.thread_ids)
    finally:
        servicer.close()


@needs_two_cpus
def test_async_llm_spreads_its_own_threads_team_for_the_first_step_after_idle(
        tiny_model_dir: Path) -> None:
    """AsyncLLM steps on a thread of its own: that thread leads the spread team, everything
    floats at rest, and each request after an idle gap starts with its first step spread."""
    import asyncio

    from strand.engine_core.async_llm import AsyncLLM

    llm = _built_with_two_threads(lambda: AsyncLLM.from_engine_args(EngineArgs(
        model=str(tiny_model_dir), kv_cache_memory=8 * 1024**2)))
    core = llm.engine.engine_core
    placements = _recorded_placements(core)

    async def two_requests() -> None:
        params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
        for name in ("a", "b"):  # one after the other: the engine goes idle between them
            async for _ in llm.generate({"prompt_token_ids": [1, 5, 9, 13, 17]}, params, name):
                pass
    try:
        asyncio.run(two_requests())  # its thread spreads before it takes the first command
        spread = core._team_spread
        assert spread is not None and spread.cpus == CPUS[:2]
        assert spread.thread_ids[0] == llm._thread.native_id
        assert all(os.sched_getaffinity(tid) == set(CPUS) for tid in spread.thread_ids)
    finally:
        llm.shutdown()
    assert placements == [{CPUS[0]}, set(CPUS), set(CPUS)] * 2


def _request(core: Any, request_id: str, params: SamplingParams) -> Any:
    from strand.engine_core.core.engine_io import EngineCoreRequest

    return EngineCoreRequest(request_id=request_id, prompt_token_ids=[1, 5, 9, 13, 17],
                             sampling_params=params, eos_token_id=None)


@needs_two_cpus
def test_threads_placed_elsewhere_since_are_left_where_they_are() -> None:
    def body() -> tuple[set[int], set[int]]:
        spread = cpu_binding.team_spread()
        assert spread is not None
        os.sched_setaffinity(0, {CPUS[1]})  # as `taskset -p` would, after the engine started
        try:
            with spread:
                inside = os.sched_getaffinity(0)
            return inside, os.sched_getaffinity(0)
        finally:
            os.sched_setaffinity(0, set(CPUS))
    assert _in_thread(body) == ({CPUS[1]}, {CPUS[1]})


def _live_threads() -> set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def _wait_until_gone(tids: set[int], timeout: float = 5.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while tids & _live_threads():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@needs_two_cpus
def test_a_threads_idle_team_is_let_go_and_comes_back_on_demand() -> None:
    from strand.platform.libgomp import release_idle_team

    a = torch.randn(256, 256)

    def body() -> tuple[bool, bool, bool]:
        spread = cpu_binding.team_spread()  # runs a region: the team exists, its ids known
        assert spread is not None
        workers = set(spread.thread_ids[1:])
        released = release_idle_team()
        gone = _wait_until_gone(workers)
        again = bool(torch.allclose(a @ a, (a.double() @ a.double()).float(), atol=1e-3))
        return released, gone, again

    released, gone, again = _in_thread(body)
    assert released and gone and again


@needs_two_cpus
def test_async_llm_lets_go_of_its_callers_team(tiny_model_dir: Path) -> None:
    """Torch work on the caller's thread before AsyncLLM leaves a team beside the engine's;
    the constructor lets it go, so the process keeps one team of compute threads."""
    from strand.engine_core.async_llm import AsyncLLM

    def body() -> bool:
        spread = cpu_binding.team_spread()  # the caller's own team, as torch work leaves it
        assert spread is not None
        workers = set(spread.thread_ids[1:])
        llm = AsyncLLM.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                   kv_cache_memory=8 * 1024**2))
        try:
            return _wait_until_gone(workers)
        finally:
            llm.shutdown()

    assert _in_thread(body) is True
