"""The engine's OpenMP threads spread over CPUs of their own for the first step after an idle gap.

torch's OpenMP team leaves placement to the kernel. Between parallel regions its threads sleep
after a short spin (openmp_env.py), and after an idle gap the kernel sometimes woke the team's two
threads onto one CPU while the other stayed idle; they then took turns at every barrier and the
step ran several times longer (`perf sched` showed both threads on one CPU and the other idle).
It happened to the first step after the gap only, to a share of lone requests over the ring
(their first token late by a multiple of a step), never to the steps that followed; the engine
stage's thread is woken by its event loop, while an in-process loop's wakes from its own timer,
and the latter did not show it.

Binding each thread to one CPU for good, as vLLM's CPU worker does, ended it, and made requests
take much longer while other processes kept the CPUs busy: a bound thread cannot move off a
busy CPU, and the team runs at the pace of its slowest thread. So the team is bound only around the
first step after the engine was idle (`TeamSpread`, used by EngineCore.step), and floats again
after it; under steady load there is no such step.

The team's thread ids come from one parallel region in which each thread reports itself
(`team_spread`): libgomp keeps the same threads for the calling thread's later regions of the
same size. Nothing is spread with one thread, with fewer allowed CPUs than threads, when the user
chose OpenMP placement (OMP_PROC_BIND, OMP_PLACES, GOMP_CPU_AFFINITY), without libgomp, or
with STRAND_CPU_BIND=off.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from types import TracebackType

from strand import envs
from strand.platform.libgomp import PARALLEL_FN, loaded_libgomp

logger = logging.getLogger(__name__)

BIND_ENV = "STRAND_CPU_BIND"
BIND_VALUES = ("auto", "off")


def binding_mode() -> str:
    """STRAND_CPU_BIND's value; ValueError naming the variable when it is none of BIND_VALUES."""
    value = envs.cpu_bind()
    if value not in BIND_VALUES:
        raise ValueError(f"{BIND_ENV} must be one of {', '.join(BIND_VALUES)}, got {value!r}")
    return value


class TeamSpread:
    """While entered, team thread i runs on cpus[i] only; on exit each thread gets back the CPUs
    it had (the kernel leaves a running thread where it is)."""

    def __init__(self, thread_ids: list[int], cpus: list[int]) -> None:
        self.thread_ids = thread_ids
        self.cpus = cpus
        self._saved: list[tuple[int, set[int]]] = []

    def __enter__(self) -> TeamSpread:
        self._saved = []
        try:
            before = [os.sched_getaffinity(tid) for tid in self.thread_ids]
        except OSError:  # a thread ended (the team was rebuilt): leave them be
            return self
        if any(cpu not in cpus for cpu, cpus in zip(self.cpus, before, strict=True)):
            return self  # someone placed the threads since (taskset): theirs to place
        for tid, cpu, cpus in zip(self.thread_ids, self.cpus, before, strict=True):
            try:
                os.sched_setaffinity(tid, {cpu})
            except OSError:  # a sandbox refuses: leave it be
                continue
            self._saved.append((tid, cpus))
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        for tid, cpus in self._saved:
            try:
                os.sched_setaffinity(tid, cpus)
            except OSError:
                continue
        self._saved = []


def team_spread() -> TeamSpread | None:
    """The calling thread's OpenMP team (torch's thread count), thread i to go on the i-th
    allowed CPU; None where nothing should be spread."""
    if binding_mode() == "off" or envs.user_omp_placement():
        return None
    import torch

    threads = torch.get_num_threads()
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cpus = allowed[:threads]
    gomp = loaded_libgomp()
    if threads < 2 or len(cpus) < threads or gomp is None:
        logger.debug("compute threads left to the kernel (%d threads, %d CPUs allowed)",
                     threads, len(allowed))
        return None
    ids: dict[int, int] = {}

    def report(_data: int | None) -> None:  # runs on every thread of the team
        ids[int(gomp.omp_get_thread_num())] = threading.get_native_id()

    callback = PARALLEL_FN(report)  # kept alive through the call
    gomp.GOMP_parallel(callback, None, ctypes.c_uint(threads), ctypes.c_uint(0))
    if sorted(ids) != list(range(threads)):
        logger.warning("found %d of %d compute threads: their placement is left to the kernel",
                       len(ids), threads)
        return None
    logger.info("compute threads spread over CPUs %s for a step after idle",
                ",".join(map(str, cpus)))
    return TeamSpread([ids[i] for i in range(threads)], cpus)
