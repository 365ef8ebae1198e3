"""The CPU accounting the overhead benchmarks use reads the counters the kernel keeps: CPU time
spent, and time spent runnable while another process held the core."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from benchmarks.cpu_accounting import (
    cpu_seconds,
    cpu_seconds_fine,
    run_queue_wait_seconds,
)


def _burn(seconds: float) -> None:
    deadline = time.process_time() + seconds
    while time.process_time() < deadline:  # bounded: CPU time passes while this runs
        pass


@pytest.mark.parametrize("clock", [cpu_seconds, cpu_seconds_fine])
def test_cpu_clocks_count_this_process_work_and_not_its_sleep(
        clock: Callable[[int], float]) -> None:
    start = clock(os.getpid())
    _burn(0.3)
    spent = clock(os.getpid()) - start
    assert 0.2 <= spent <= 1.0
    time.sleep(0.1)
    assert clock(os.getpid()) - start - spent < 0.05


def test_cpu_seconds_are_the_process_user_and_system_times() -> None:
    times = os.times()
    assert abs(cpu_seconds(os.getpid()) - (times.user + times.system)) < 0.1


def test_a_process_sharing_its_only_core_with_a_busy_one_waits_in_the_run_queue() -> None:
    cpu = min(os.sched_getaffinity(0))
    own = os.sched_getaffinity(0)
    busy = subprocess.Popen([sys.executable, "-c", "import os, time\n"
                             f"os.sched_setaffinity(0, {{{cpu}}})\n"
                             "end = time.monotonic() + 3\n"
                             "while time.monotonic() < end: pass\n"])
    try:
        time.sleep(0.3)  # the busy loop is running on that core
        os.sched_setaffinity(0, {cpu})
        before = run_queue_wait_seconds(os.getpid())
        _burn(0.3)  # about 0.6 s of wall time with the core shared half and half
        waited = run_queue_wait_seconds(os.getpid()) - before
    finally:
        os.sched_setaffinity(0, own)
        busy.kill()
        busy.wait()
    assert waited > 0.1


def test_a_sleeping_process_does_not_wait_in_the_run_queue() -> None:
    before = run_queue_wait_seconds(os.getpid())
    time.sleep(0.3)
    assert run_queue_wait_seconds(os.getpid()) - before < 0.1
