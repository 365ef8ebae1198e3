"""Keep large CPU allocations in the heap, so a decode step does not pay page faults.

glibc serves allocations above M_MMAP_THRESHOLD (128 KiB to 32 MiB, adaptive) with a fresh mmap
and returns them to the kernel on free. A step allocates tens of MB of gathered K/V, attention
output and activations per layer; with mmap each of those pages is faulted in and zeroed by the
kernel every time, which measured several times slower than the copy itself. Raising the
thresholds keeps freed memory in the process and reuses it.

That holds for the main arena only: a thread other than the main one (the engine service steps
on its own thread) gets an arena of mmap'ed heaps that are trimmed back to the kernel as they
empty: a run stepped there took far more page faults. One arena for every thread keeps all of them
on the tuned heap; the engine's allocations are few and large, so sharing its lock costs nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8
_TUNED = False


def tune_cpu_allocator(mmap_threshold: int = 1 << 30, trim_threshold: int = 1 << 31) -> bool:
    """Once per process, on Linux with glibc; False (and no change) anywhere else."""
    global _TUNED
    if _TUNED:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
            libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)) and bool(
            libc.mallopt(_M_ARENA_MAX, 1))
    except (OSError, AttributeError):
        return False
    _TUNED = ok
    if ok:
        logger.info("glibc malloc: large blocks kept in the heap (mmap threshold %d MiB)",
                    mmap_threshold >> 20)
    return ok


def trim_heap() -> None:
    """Hands the heap's free pages back to the system (glibc; elsewhere a no-op): after
    loading, what loading freed (staging rows, the copies the packed layouts replaced) would
    otherwise stay in the process, as the trim threshold above keeps it."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    try:
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
