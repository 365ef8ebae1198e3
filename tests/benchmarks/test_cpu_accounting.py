"""The CPU accounting the overhead benchmarks use reads the counters the kernel keeps: CPU time
spent, and time spent runnable while another process held the core."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from benchmarks.cpu_accounting import ThreadClock, cpu_seconds, thread_times_since


def _burn(seconds: float) -> None:
    deadline = time.process_time() + seconds
    while time.process_time() < deadline:  # bounded: CPU time passes while this runs
        pass


def test_cpu_seconds_count_this_process_work_and_not_its_sleep() -> None:
    start = cpu_seconds(os.getpid())
    _burn(0.3)
    spent = cpu_seconds(os.getpid()) - start
    assert 0.2 <= spent <= 1.0
    time.sleep(0.1)
    assert cpu_seconds(os.getpid()) - start - spent < 0.05


def test_the_thread_clock_counts_this_process_work_and_not_its_sleep() -> None:
    start = ThreadClock(os.getpid())
    _burn(0.3)
    spent = thread_times_since(start).cpu_s
    assert 0.2 <= spent <= 1.0
    time.sleep(0.1)
    assert thread_times_since(start).cpu_s - spent < 0.05


def _burning_thread(seconds: float) -> threading.Thread:
    """A thread that spends `seconds` of its own CPU time (its clock, not the process's)."""
    def burn() -> None:
        deadline = time.thread_time() + seconds
        while time.thread_time() < deadline:
            pass

    thread = threading.Thread(target=burn)
    thread.start()
    return thread


def test_a_thread_that_ends_between_the_snapshots_does_not_make_the_run_negative() -> None:
    # The failure this guards against (seen in CI): a sum over the live threads loses a
    # thread's whole lifetime when it ends, so "after - before" came out below zero. Here the
    # old thread takes ~0.3 s out of such a sum while this one adds 0.2 s.
    old = _burning_thread(0.4)
    time.sleep(0.3)  # the old thread has spent ~0.3 s of its 0.4 by the first snapshot
    start = ThreadClock(os.getpid())
    old.join()
    _burn(0.2)  # the old thread has ended: the process's CPU time is this thread's
    run = thread_times_since(start)
    assert run.wait_s >= 0
    assert 0.15 <= run.cpu_s < 0.6  # this thread's 0.2 s; the old one's last share is lost


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
        start = ThreadClock(os.getpid())
        _burn(0.3)  # about 0.6 s of wall time with the core shared half and half
        waited = thread_times_since(start).wait_s
    finally:
        os.sched_setaffinity(0, own)
        busy.kill()
        busy.wait()
    assert waited > 0.1


def test_a_sleeping_process_does_not_wait_in_the_run_queue() -> None:
    start = ThreadClock(os.getpid())
    time.sleep(0.3)
    assert thread_times_since(start).wait_s < 0.1
