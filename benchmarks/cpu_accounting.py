"""Where a run's CPU went, per process, from the counters the kernel keeps for it.

A throughput ratio below 1 has two possible causes: the ring's own waits (steps that start late),
or other processes taking the engine's cores. On a machine whose engine uses every core, any CPU
second another process spends comes out of the engine's threads; and while one thread of an OpenMP
team is off its core, the others wait for it at the region's end, so the team loses about the
other process's CPU time in wall time. The second cause shows in two counters: the other processes'
CPU seconds, and the time the engine's threads spent runnable but waiting for a core (the run
queue), which both are read here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far, its ended threads included (fields 14
    and 15 of /proc/PID/stat; 10 ms ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


@dataclass(frozen=True)
class ThreadTimes:
    """What a process's threads did between two snapshots, in seconds."""

    cpu_s: float  # on a core
    wait_s: float  # runnable, but waiting in the run queue for a core


class ThreadClock:
    """One process's per-thread schedstat counters (nanoseconds, finer than /proc's 10 ms ticks).

    A thread on a core is counted up to its last tick or switch (up to 4 ms behind at HZ=250):
    fine for processes that sleep between requests, wrong for a busy caller timing a short run of
    its own, whose reading can come out 0 (that caller reads time.process_time instead).

    `since` adds up each thread's growth, not the difference of two sums over the live threads:
    a thread that ends between the snapshots would take its whole lifetime's counts out of the
    second sum, and a run could come out negative. Here such a thread's last share is lost (its
    counters went with it), a thread born since counts from zero, and nothing is below zero."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.threads = _thread_counters(pid)

    def since(self, earlier: ThreadClock) -> ThreadTimes:
        cpu = wait = 0
        for tid, (now_cpu, now_wait) in self.threads.items():
            was_cpu, was_wait = earlier.threads.get(tid, (0, 0))
            if now_cpu < was_cpu or now_wait < was_wait:  # the tid was reused by a new thread
                was_cpu = was_wait = 0
            cpu += now_cpu - was_cpu
            wait += now_wait - was_wait
        return ThreadTimes(cpu / 1e9, wait / 1e9)


def thread_times_since(earlier: ThreadClock) -> ThreadTimes:
    """What `earlier`'s process did from that snapshot to now."""
    return ThreadClock(earlier.pid).since(earlier)


def _thread_counters(pid: int) -> dict[str, tuple[int, int]]:
    counters = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                cpu, wait = f.read().split()[:2]
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended between the listing and the read
        counters[tid] = (int(cpu), int(wait))
    return counters
