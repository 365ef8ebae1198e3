"""Pin processes to CPU sets: the engine on cores of its own, everything else on the rest.

On a small machine the services and the benchmark's client take CPU from the engine's own cores,
so a ring-against-in-process ratio measures the core count as much as the ring. Pinning the
engine (in process, and the engine stage) to the same cores in both runs, and the stages and the
client to the others, holds the engine's compute equal: what is left is the ring's own cost.
"""

from __future__ import annotations

import os
from pathlib import Path


def parse_cpu_list(text: str) -> set[int]:
    """A Linux CPU list ("0", "0,2", "0-3,6") as a set; ValueError naming the bad part."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"engine_cpus: {part.strip()!r} is not a CPU number or range "
                             "(e.g. 0 or 0-1)")
        low, high = int(first), int(last or first)
        if high < low:
            raise ValueError(f"engine_cpus: range {part.strip()!r} runs backwards")
        cpus.update(range(low, high + 1))
    return cpus


def split_cpus(engine_cpus: set[int]) -> tuple[set[int], set[int]]:
    """(the engine's CPUs, the rest) of the CPUs this process may use; both must be non-empty."""
    available = os.sched_getaffinity(0)
    missing = engine_cpus - available
    if missing:
        raise ValueError(f"engine_cpus: {sorted(missing)} not among this process's CPUs "
                         f"{sorted(available)}")
    rest = available - engine_cpus
    if not rest:
        raise ValueError(f"engine_cpus: {sorted(engine_cpus)} leaves no CPU for the other "
                         f"stages (available: {sorted(available)})")
    return engine_cpus, rest


def pin_process(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` (an OpenMP pool already started included) onto `cpus`; threads it
    starts later inherit the mask of the thread that starts them."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except ProcessLookupError:  # a thread that ended since the listing
            continue

