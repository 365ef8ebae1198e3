"""A long scheduler time slice for the threads that compute steps, so the stages beside them run
the moment they wake.

Linux's EEVDF scheduler (6.6 and later) lets a running thread keep its core until it has used its
time slice (about 1.5 ms here) before a thread that wakes gets it, unless the waking thread asks
for a shorter slice than the running one (6.12 and later, `sched_attr.sched_runtime` on an
ordinary thread). When the engine's OpenMP threads hold both cores of a small machine with the
next step, every hop of a first token's way out (the engine's event loop, the detokenizer, the
gateway, the client) woke and then waited for a slice: 2-4 ms of a lone request's time to first
token after an idle gap (benchmarks/README.md, session 24). With a long slice on the compute
threads, every other thread's default slice is the shorter one, and it runs at once.

Nothing else changes: the threads keep their weight (nice), so their share of the CPU is the
same; they only wait their turn after a wake-up rather than pushing others out of theirs. A
thread started later by one that has the slice inherits it, which is how libgomp's OpenMP team
gets it: call this at the start of the thread that will load and step the model, before its first
parallel region. Kernels without custom slices, other systems, or a sandbox that refuses the
call leave everything as it was.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import struct

logger = logging.getLogger(__name__)

# The longest slice the kernel takes is 100 ms; 20 ms is long against the default's ~1.5 ms and
# short enough not to hold a CPU-bound neighbour off for noticeably long.
COMPUTE_SLICE_NS = 20_000_000
# "0" keeps the kernel's default slice (to compare, or on a machine where it does not help).
SLICE_ENV = "STRAND_COMPUTE_SLICE_MS"
# sched_setattr / sched_getattr syscall numbers.
_SYSCALLS = {"x86_64": (314, 315), "aarch64": (274, 275)}
# struct sched_attr up to sched_period (SCHED_ATTR_SIZE_VER0): size, policy, flags, nice,
# priority, runtime, deadline, period.
_ATTR = struct.Struct("IIQiIQQQ")
_FAIR_POLICIES = (0, 3)  # SCHED_OTHER, SCHED_BATCH: the policies whose runtime is a slice


def slice_from_env() -> int:
    """The slice to ask for, in ns (0: none); ValueError naming the variable when unreadable."""
    raw = os.environ.get(SLICE_ENV)
    if raw is None or raw == "":
        return COMPUTE_SLICE_NS
    try:
        ms = float(raw)
    except ValueError:
        raise ValueError(f"{SLICE_ENV} must be a number of milliseconds, got {raw!r}") from None
    if not 0 <= ms <= 100:
        raise ValueError(f"{SLICE_ENV} must be between 0 and 100 ms, got {raw!r}")
    return int(ms * 1e6)


def thread_slice_ns() -> int | None:
    """The calling thread's slice as the kernel reports it (None where it cannot say)."""
    attr = _get_attr()
    return None if attr is None else attr[5]


def lengthen_compute_slice(slice_ns: int | None = None) -> bool:
    """Ask for `slice_ns` (default: the environment's, else COMPUTE_SLICE_NS) for the calling
    thread and the threads it starts later. True when the kernel now reports that slice."""
    wanted = slice_from_env() if slice_ns is None else slice_ns
    attr = _get_attr()
    if wanted <= 0 or attr is None or attr[1] not in _FAIR_POLICIES:
        return False
    _size, policy, _flags, nice, _prio, _runtime, _deadline, _period = attr
    # The same policy and nice: only the slice changes (a zero runtime would mean "default").
    request = _ATTR.pack(_ATTR.size, policy, 0, nice, 0, wanted, 0, 0)
    if _syscall(0, request) != 0:
        return False
    taken = thread_slice_ns() == wanted
    if not taken:
        # A kernel before 6.12 takes the call and ignores the runtime of an ordinary thread.
        logger.debug("the kernel keeps its own time slice for compute threads")
    return taken


def _get_attr() -> tuple[int, ...] | None:
    buf = ctypes.create_string_buffer(_ATTR.size)
    if _syscall(1, buf) != 0:
        return None
    return _ATTR.unpack(buf.raw)


def _syscall(which: int, buf: bytes | ctypes.Array[ctypes.c_char]) -> int:
    numbers = _SYSCALLS.get(platform.machine())
    if platform.system() != "Linux" or numbers is None:
        return -1
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if which == 0:  # sched_setattr(tid 0 = this thread, attr, flags)
            return int(libc.syscall(numbers[0], 0, ctypes.c_char_p(bytes(buf)), 0))
        return int(libc.syscall(numbers[1], 0, buf, _ATTR.size, 0))  # sched_getattr
    except (OSError, AttributeError):
        return -1
