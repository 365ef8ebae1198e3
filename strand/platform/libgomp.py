"""The libgomp that torch loaded, through ctypes: the OpenMP runtime whose teams run the engine's
kernels (torch's CPU wheels bundle it). None where torch uses another OpenMP runtime or none."""

from __future__ import annotations

import ctypes

PARALLEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
OMP_PAUSE_SOFT = 1  # omp_pause_resource_kind: let the threads go, keep nothing else


def loaded_libgomp() -> ctypes.CDLL | None:
    """The libgomp mapped into this process, its entry points typed; None without one."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libgomp" in line}
    except OSError:
        return None
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
            lib.GOMP_parallel.restype = None
            lib.GOMP_parallel.argtypes = [PARALLEL_FN, ctypes.c_void_p, ctypes.c_uint,
                                          ctypes.c_uint]
            lib.omp_get_thread_num.restype = ctypes.c_int
            return lib
        except (OSError, AttributeError):
            continue
    return None


def release_idle_team() -> bool:
    """Let the calling thread's OpenMP team go: its idle threads exit (a later parallel region
    on this thread starts a new team). libgomp cuts every team's spin between regions to ~100
    iterations while it manages more threads than there are CPUs, so a second team in the
    process (a caller's, left by torch work it did on its own thread) slows the engine's steps
    (measurably AsyncLLM's, with few CPUs). True when libgomp let it go
    or there was none; False without libgomp or its OpenMP 5.0 pause call."""
    lib = loaded_libgomp()
    pause = getattr(lib, "omp_pause_resource_all", None) if lib is not None else None
    if pause is None:
        return False
    pause.restype = ctypes.c_int
    pause.argtypes = [ctypes.c_int]
    return bool(pause(OMP_PAUSE_SOFT) == 0)
