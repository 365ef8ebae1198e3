"""gRPC's TCP path, chosen before grpc is first imported: the floor under every hop of the ring.

grpcio's default TCP path (EventEngine) hands a message that arrives at an idle process from the
thread that polls the socket to a thread pool, then to grpc.aio's completion-queue thread, then to
the asyncio loop. Its older path (iomgr) reads the socket on the thread that waits for completions:
one thread wake-up fewer. `python -m benchmarks.grpc_hop` measures it: one stream message is
received sooner on iomgr, after an idle gap and back to back alike; the gain is in the receiving
process, and a lone request's first token is received six times on its way through the ring.

Opt-in (STRAND_GRPC_IOMGR=1), not the default: over the whole ring a lone request's added time
to first token did not move beyond the run-to-run spread (alternating rounds of the two paths),
and CI's one run with it on by default failed a
fault-recovery test once (a request added right after a restarted detokenizer was ready found it
not subscribed to the engine; not seen again in three reruns of that file). iomgr is also the path gRPC means to
retire.

gRPC reads GRPC_EXPERIMENTS once, when its core starts, so it must be in the environment before
`import grpc`: `strand/services/__init__.py` calls `apply()`, which every stage's `python -m strand.services.X`
runs first. A GRPC_EXPERIMENTS the user set is kept as it is. Only the grpcio minor releases it
was measured on take it: a later one may have retired iomgr, and gRPC only logs and ignores an
experiment name it no longer knows.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from importlib import metadata

from strand import envs

ENV = "GRPC_EXPERIMENTS"
OPT_IN_ENV = "STRAND_GRPC_IOMGR"
# Client channels, listeners and every other endpoint back on iomgr (all three: a process both
# serves and dials, and the saving is on whichever side receives).
IOMGR_TCP = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"
MEASURED_MINORS = frozenset({(1, 85)})  # grpcio (major, minor) releases benchmarks/grpc_hop ran on


def grpcio_minor() -> tuple[int, int] | None:
    """The installed grpcio's (major, minor), read from its metadata without importing it."""
    try:
        major, minor = metadata.version("grpcio").split(".")[:2]
        return int(major), int(minor)
    except (metadata.PackageNotFoundError, ValueError):
        return None


def apply(environ: MutableMapping[str, str] = os.environ,
          minor: tuple[int, int] | None = None) -> bool:
    """Put gRPC on its iomgr TCP path where STRAND_GRPC_IOMGR=1 asks; True when this call set
    it."""
    if envs.user_grpc_experiments(environ) or not envs.grpc_iomgr(environ):
        return False
    if (minor or grpcio_minor()) not in MEASURED_MINORS:
        return False
    environ[ENV] = IOMGR_TCP
    return True
