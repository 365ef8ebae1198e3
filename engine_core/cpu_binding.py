"""Each of the engine's OpenMP threads on a CPU of its own.

torch's OpenMP team leaves placement to the kernel. Between parallel regions its threads sleep
after a short spin (openmp_env.py), and every region wakes them again; the kernel places a woken
thread near its waker, and on a small machine it sometimes put the team's two threads on one CPU
while the other stayed idle. They then took turns at every barrier and the step ran 2-4x longer,
until load balancing split them up: 10-14 of 80 lone requests over the ring had a first step of
16-30 ms instead of 8 (`perf sched` showed both threads on CPU 1 and CPU 0 idle; benchmarks/
README.md, session 24). In process the stepping thread is the main one, which wakes from its own
timer, and it did not happen. vLLM's CPU worker binds its threads the same way.

`bind_compute_threads` runs one parallel region in which each thread of the calling thread's team
binds itself to one CPU, `slot` choosing which of the allowed CPUs (tensor-parallel ranks on one
host take disjoint ones). Threads the bound thread starts later inherit its one CPU: a helper
thread that should float calls `release_thread` as it starts. Binding is skipped with one thread,
when the slot's CPUs are not all allowed, when the user chose OpenMP placement
(OMP_PROC_BIND, OMP_PLACES, GOMP_CPU_AFFINITY), without libgomp, or with STRAND_CPU_BIND=off.
"""

from __future__ import annotations

import ctypes
import logging
import os

logger = logging.getLogger(__name__)

BIND_ENV = "STRAND_CPU_BIND"
BIND_VALUES = ("auto", "off")
_USER_PLACEMENT = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY")
_PARALLEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# The CPUs this process may use, as they were before a thread was bound (release_thread's set).
_process_cpus: set[int] | None = None


def binding_mode() -> str:
    """STRAND_CPU_BIND's value; ValueError naming the variable when it is none of BIND_VALUES."""
    value = os.environ.get(BIND_ENV, "auto") or "auto"
    if value not in BIND_VALUES:
        raise ValueError(f"{BIND_ENV} must be one of {', '.join(BIND_VALUES)}, got {value!r}")
    return value


def bind_compute_threads(slot: int = 0) -> list[int] | None:
    """Bind the calling thread's OpenMP team (torch's thread count), thread i to the i-th CPU of
    the slot's share of the allowed CPUs. The CPUs bound, or None where it did not bind."""
    global _process_cpus
    if binding_mode() == "off" or any(name in os.environ for name in _USER_PLACEMENT):
        return None
    import torch

    threads = torch.get_num_threads()
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    cpus = allowed[slot * threads:(slot + 1) * threads]
    gomp = _libgomp()
    if threads < 2 or len(cpus) < threads or gomp is None:
        logger.debug("compute threads left unbound (%d threads, %d CPUs allowed, slot %d)",
                     threads, len(allowed), slot)
        return None
    bound: dict[int, int] = {}

    def bind(_data: int | None) -> None:  # runs on every thread of the team
        index = int(gomp.omp_get_thread_num())
        try:
            os.sched_setaffinity(0, {cpus[index]})
        except (OSError, IndexError):
            return
        bound[index] = cpus[index]

    _process_cpus = _process_cpus or set(allowed)
    # The callback object must outlive the call; libgomp runs it on each thread of the team.
    callback = _PARALLEL_FN(bind)
    gomp.GOMP_parallel(callback, None, ctypes.c_uint(threads), ctypes.c_uint(0))
    if len(bound) != threads:
        logger.warning("bound %d of %d compute threads to their CPUs", len(bound), threads)
    else:
        logger.info("compute threads bound to CPUs %s", ",".join(map(str, cpus)))
    return [bound[i] for i in sorted(bound)]


def release_thread() -> None:
    """Let the calling thread run on every CPU the process had before binding (a helper thread
    started by a bound one); nothing when no thread was bound."""
    if _process_cpus is not None:
        os.sched_setaffinity(0, _process_cpus)


def _libgomp() -> ctypes.CDLL | None:
    """The libgomp torch loaded (its team is the one to bind), or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
            lib.GOMP_parallel.restype = None
            lib.GOMP_parallel.argtypes = [_PARALLEL_FN, ctypes.c_void_p, ctypes.c_uint,
                                          ctypes.c_uint]
            lib.omp_get_thread_num.restype = ctypes.c_int
            return lib
        except (OSError, AttributeError):
            continue
    return None
