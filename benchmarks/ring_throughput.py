"""Throughput over the ring against in process, in alternating pairs, with where each run's CPU
went (benchmarks/cpu_accounting.py): the ratio, and what explains it.

Each pair is LLMEngine's add-all-then-step loop in this process and the same workload as one
FINAL_ONLY Generate stream per request on the auto-stepping stack. Around each run: its wall time,
each process's CPU seconds, and the engine's threads' time waiting for a core (this process's in
process, the engine stage's over the ring).

The order within a pair alternates (in process first, then the ring first: ABBA). A shared VM's
speed drifts within minutes, mostly downwards under sustained load: with the in-process run
always first, every pair's ring ran on the slower machine (the first pair's in-process run was
the fastest run of all, and that pair the lowest ratio). An even number of pairs cancels a
steady drift.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any

from benchmarks.common import format_table, log
from benchmarks.cpu_accounting import ThreadClock, ThreadTimes, thread_times_since
from benchmarks.cpu_pinning import pin_process
from benchmarks.datasets import SampleRequest

ENGINE = "engine"


class Placement:
    """Where this process runs: on the engine's CPUs while it is the engine (in process), on the
    others while it is the ring's client. Without pinning, nothing moves."""

    def __init__(self, pinned: tuple[set[int], set[int]] | None, stages: dict[str, int]) -> None:
        self.pinned = pinned
        if pinned is not None:
            for name, pid in stages.items():
                pin_process(pid, pinned[0] if name.startswith(ENGINE) else pinned[1])

    def engine_side(self) -> None:
        if self.pinned is not None:
            pin_process(os.getpid(), self.pinned[0])

    def client_side(self) -> None:
        if self.pinned is not None:
            pin_process(os.getpid(), self.pinned[1])


@dataclass(slots=True)
class PairRun:
    in_process_tok_s: float
    ring_tok_s: float
    in_process_s: float  # wall seconds of each run
    ring_s: float
    in_process_cpu_s: float  # this process's CPU seconds in its run
    ring_cpu_s: dict[str, float]  # each process's CPU seconds in the ring's run, the client's too
    in_process_wait_s: float  # the engine's threads waiting for a core (run queue), each run
    ring_wait_s: float
    ring_first: bool = False  # which of the two ran first

    @property
    def ratio(self) -> float:
        return self.ring_tok_s / self.in_process_tok_s

    @property
    def others_cpu_s(self) -> float:
        """CPU seconds the ring's run spent outside the engine stage (the stages, the client)."""
        return sum(v for name, v in self.ring_cpu_s.items() if not name.startswith(ENGINE))


def throughput_pairs(engine: Any, client: Any, requests: list[SampleRequest], repeats: int,
                     stages: dict[str, int], target: str, place: Placement | None = None
                     ) -> list[PairRun]:
    """`repeats` pairs run back to back. `stages`: the stack's process ids by name (the engine's
    named "engine..."); `target`: its gateway; this process is counted as the ring's client
    (benchmarks/gateway_streams.py: one asyncio client, no thread per stream)."""
    from benchmarks.strand_backends import run_loop, run_streams, warm_up, warm_up_streams

    if repeats <= 0:
        return []
    place = place or Placement(None, {})
    place.engine_side()
    warm_up(engine, requests)
    place.client_side()
    warm_up_streams(client, requests)
    me = os.getpid()
    engines = [name for name in stages if name.startswith(ENGINE)]

    def in_process() -> tuple[Any, ThreadTimes]:
        place.engine_side()
        # CPU from the process clock: the kernel brings a running thread's counters up to date
        # for it, while its schedstat lags to the last tick (4 ms at HZ=250), longer than a tiny
        # run. The run queue's wait is only counted when a thread waited, so schedstat has it.
        start, cpu = ThreadClock(me), time.process_time()
        result = run_loop("strand", engine, requests)
        return result, ThreadTimes(time.process_time() - cpu, thread_times_since(start).wait_s)

    def over_ring() -> tuple[Any, dict[str, ThreadTimes], float]:
        place.client_side()
        # The stages from their threads' counters; the client (this process) from its process
        # clock, which counts its threads that end within the run and is up to date.
        clocks = {name: ThreadClock(pid) for name, pid in stages.items()}
        client_cpu = time.process_time()
        result = run_streams("strand-gateway", target, requests)
        return (result, {name: thread_times_since(clock) for name, clock in clocks.items()},
                time.process_time() - client_cpu)

    pairs = []
    for i in range(repeats):
        ring_first = i % 2 == 1
        log(f"throughput pair {i + 1}/{repeats}: "
            + ("over the ring, then in process" if ring_first else "in process, then over the ring"))
        if ring_first:
            ring, runs, client_cpu_s = over_ring()
            local, local_run = in_process()
        else:
            local, local_run = in_process()
            ring, runs, client_cpu_s = over_ring()
        if local.num_failed or ring.num_failed:
            raise RuntimeError(f"failed requests: in process {local.num_failed}, "
                               f"ring {ring.num_failed}")
        pairs.append(PairRun(
            local.output_tokens_per_s, ring.output_tokens_per_s, local.elapsed_s,
            ring.elapsed_s, local_run.cpu_s,
            {**{name: run.cpu_s for name, run in runs.items()}, "client": client_cpu_s},
            local_run.wait_s, sum(runs[name].wait_s for name in engines), ring_first))
    place.client_side()  # as after a pair that ended with the ring (the caller's client runs on)
    return pairs


def pairs_to_json(pairs: list[PairRun]) -> dict[str, Any]:
    ratios = [p.ratio for p in pairs]
    return {"in_process_tok_s": [p.in_process_tok_s for p in pairs],
            "ring_tok_s": [p.ring_tok_s for p in pairs], "ratios": ratios,
            "first": ["ring" if p.ring_first else "in process" for p in pairs],
            "ratio_median": statistics.median(ratios),
            "in_process_s": [p.in_process_s for p in pairs],
            "ring_s": [p.ring_s for p in pairs],
            "in_process_cpu_s": [p.in_process_cpu_s for p in pairs],
            "ring_cpu_s": [p.ring_cpu_s for p in pairs],
            "others_cpu_s": [p.others_cpu_s for p in pairs],
            "in_process_engine_wait_s": [p.in_process_wait_s for p in pairs],
            "ring_engine_wait_s": [p.ring_wait_s for p in pairs]}


def pairs_table(tp: dict[str, Any]) -> str:
    rows = [[str(i + 1), first, f"{a:.1f}", f"{b:.1f}", f"{r:.3f}", f"{rs - ls:+.2f}", f"{o:.2f}",
             f"{lw:.2f} / {rw:.2f}"]
            for i, (first, a, b, r, ls, rs, o, lw, rw) in enumerate(zip(
                tp["first"], tp["in_process_tok_s"], tp["ring_tok_s"], tp["ratios"],
                tp["in_process_s"], tp["ring_s"], tp["others_cpu_s"],
                tp["in_process_engine_wait_s"], tp["ring_engine_wait_s"], strict=True))]
    rows.append(["median", "", "", "", f"{tp['ratio_median']:.3f}", "", "", ""])
    return format_table(["pair", "first", "in process tok/s", "ring tok/s", "ratio",
                         "ring - in process s",
                         "CPU s outside the engine (ring)",
                         "engine threads' run-queue wait s (in process / ring)"], rows)
