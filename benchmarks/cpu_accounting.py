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

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far, its ended threads included (fields 14
    and 15 of /proc/PID/stat; 10 ms ticks)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def cpu_seconds_fine(pid: int) -> float:
    """CPU seconds of one process's live threads, in nanoseconds from /proc/PID/task/*/schedstat:
    /proc's stat counts 10 ms ticks, coarser than a lone request's few milliseconds per stage."""
    return _schedstat_sum(pid, 0)


def run_queue_wait_seconds(pid: int) -> float:
    """Seconds the process's live threads were runnable but not running (waiting for a core),
    the second field of /proc/PID/task/*/schedstat."""
    return _schedstat_sum(pid, 1)


def _schedstat_sum(pid: int, field: int) -> float:
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[field])
        except (FileNotFoundError, ProcessLookupError):
            pass  # the thread ended between the listing and the read
    return total / 1e9
