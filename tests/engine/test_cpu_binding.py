"""The engine's OpenMP team bound one thread per CPU (cpu_binding.py says why), in a thread of its
own so the test process's threads keep their CPUs."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from engine_core import cpu_binding

CPUS = sorted(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="binding needs two CPUs")


def _in_thread(fn: Callable[[], Any]) -> Any:
    """fn on a new thread with a 2-thread torch team; its result."""
    box: dict[str, Any] = {}

    def run() -> None:
        torch.set_num_threads(2)
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


def _single_cpu_threads() -> dict[int, set[int]]:
    out = {}
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            cpus = os.sched_getaffinity(int(tid))
        except OSError:  # the thread ended meanwhile
            continue
        if len(cpus) == 1 and cpus != set(CPUS):
            out[int(tid)] = cpus
    return out


@needs_two_cpus
def test_each_thread_of_the_team_gets_a_cpu_of_its_own() -> None:
    a = torch.randn(256, 256)

    def body() -> tuple[list[int] | None, set[int], dict[int, set[int]], torch.Tensor, set[int]]:
        before = _single_cpu_threads()
        cpus = cpu_binding.bind_compute_threads()
        mine = os.sched_getaffinity(0)
        team = {t: c for t, c in _single_cpu_threads().items() if t not in before}
        child: dict[str, set[int]] = {}
        helper = threading.Thread(target=lambda: child.setdefault("cpus", os.sched_getaffinity(0)))
        helper.start()
        helper.join()
        return cpus, mine, team, a @ a, child["cpus"]

    cpus, mine, team, product, inherited = _in_thread(body)
    assert cpus == CPUS[:2]
    assert mine == {CPUS[0]}
    # The calling thread and one worker, on the two CPUs.
    assert sorted(next(iter(c)) for c in team.values()) == CPUS[:2]
    torch.testing.assert_close(product, a @ a)  # the bound team still computes
    assert inherited == {CPUS[0]}  # a thread the bound one starts inherits its CPU


@needs_two_cpus
def test_a_helper_thread_floats_again_after_release() -> None:
    def body() -> set[int]:
        cpu_binding.bind_compute_threads()
        seen: dict[str, set[int]] = {}

        def helper() -> None:
            cpu_binding.release_thread()
            seen["cpus"] = os.sched_getaffinity(0)
        thread = threading.Thread(target=helper)
        thread.start()
        thread.join()
        return seen["cpus"]

    assert _in_thread(body) == set(CPUS)


@pytest.mark.parametrize("env", [{"STRAND_CPU_BIND": "off"}, {"OMP_PROC_BIND": "close"},
                                 {"GOMP_CPU_AFFINITY": "0-1"}])
def test_the_users_choice_leaves_the_threads_where_they_are(
        env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _in_thread(lambda: (cpu_binding.bind_compute_threads(),
                               os.sched_getaffinity(0))) == (None, set(CPUS))


def test_a_slot_past_the_allowed_cpus_binds_nothing() -> None:
    assert _in_thread(lambda: (cpu_binding.bind_compute_threads(slot=len(CPUS)),
                               os.sched_getaffinity(0))) == (None, set(CPUS))


def test_one_thread_is_left_to_the_scheduler() -> None:
    def body() -> tuple[list[int] | None, set[int]]:
        torch.set_num_threads(1)
        return cpu_binding.bind_compute_threads(), os.sched_getaffinity(0)
    assert _in_thread(body) == (None, set(CPUS))


def test_an_unknown_mode_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRAND_CPU_BIND", "yes")
    with pytest.raises(ValueError, match="STRAND_CPU_BIND must be one of auto, off, got 'yes'"):
        cpu_binding.bind_compute_threads()


@needs_two_cpus
def test_the_engine_stage_binds_its_core_thread_and_leaves_its_loop_free(
        tiny_model_dir: Path) -> None:
    from engine_core.config import EngineArgs
    from services.engine.servicer import EngineServicer

    own = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        servicer = EngineServicer.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                              kv_cache_memory=8 * 1024**2))
    finally:
        torch.set_num_threads(own)
    try:
        core_cpus = servicer.thread.submit(os.sched_getaffinity, 0).result()
        assert core_cpus == {CPUS[0]}
        assert os.sched_getaffinity(0) == set(CPUS)  # this (the event loop's) thread floats
    finally:
        servicer.close()


@needs_two_cpus
def test_with_a_batch_queue_the_worker_that_runs_the_forward_is_bound(
        tiny_model_dir: Path) -> None:
    from engine_core.config import EngineArgs
    from engine_core.engine_core import EngineCore

    def body() -> tuple[list[int] | None, set[int], set[int]]:
        core = EngineCore.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                      kv_cache_memory=8 * 1024**2,
                                                      max_concurrent_batches=2))
        try:
            cpus = core.bind_compute_threads()
            assert core.batch_queue is not None
            worker = core.batch_queue.call(lambda: os.sched_getaffinity(0))
            return cpus, worker, os.sched_getaffinity(0)
        finally:
            core.shutdown()

    cpus, worker, caller = _in_thread(body)
    assert cpus == CPUS[:2] and worker == {CPUS[0]}
    assert caller == set(CPUS)  # the thread that schedules floats
