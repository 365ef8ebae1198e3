"""The ring-overhead benchmark's CPU accounting reads the same clock the kernel keeps."""

from __future__ import annotations

import os
import time

from benchmarks.ring_overhead import cpu_seconds


def test_cpu_seconds_of_this_process_follow_its_own_times() -> None:
    start = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:  # burn 0.3 s of CPU, bounded
        pass
    spent = cpu_seconds(os.getpid()) - start
    assert 0.2 <= spent <= 1.0
    times = os.times()
    assert abs(cpu_seconds(os.getpid()) - (times.user + times.system)) < 0.1
