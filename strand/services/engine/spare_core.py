"""Auto mode on a CPU engine whose threads fill the machine: the decode step right after a
request's first token runs on one thread fewer, at low load.

A lone request's first token leaves the engine in a step message and then needs a CPU in the
detokenizer, in the gateway and in the client, one after the other. The engine starts its next
step a few tenths of a millisecond after the message, and its OpenMP team took every core: on a
2-core machine the token then waited for a CPU between the gateway and the client, and the
contended step ran several times its own length. With that one step on one thread fewer, a core
stays free for the token's way out: beside a stack without it, lone requests alternating between
the two, the client's TTFT p50 and p90 came out lower in most runs, and the last token of a short
request sooner; `benchmarks/ring_overhead.py` measures it (its p90 falls, its median stays within
the noise). In-process `LLMEngine`, the yardstick, runs no next step while its caller
takes the first token.

Only that one step, and only where it helps and costs little:
- it follows a step that carried some request's first token (TTFT is the wait with nothing
  shown; later tokens go out while the next step computes, as before, with every thread: a lone
  request's decode on one thread of two is measurably slower);
- low load: the step before was short (under the back-to-back threshold), at most
  LOW_LOAD_REQUESTS requests are unfinished, and the step decodes only (a prefill keeps every
  thread: its own TTFT depends on it);
- the engine computes on the CPU in this process (no tensor-parallel ranks) with as many threads
  as it has CPUs: otherwise the stages find a free core anyway.

Tried first, not kept: holding the next step 1-2 ms instead (an idle engine while the token
travels) moved the TTFT by less than it delayed the second token.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from strand.engine_core.core.engine_io import EngineCoreOutputs

# At most this many unfinished requests: the step's every request decodes a little slower.
LOW_LOAD_REQUESTS = 4


def fills_cpus(device_type: str, num_threads: int, tensor_parallel_size: int) -> bool:
    """Whether the engine's steps take every CPU this process may run on."""
    return (device_type == "cpu" and tensor_parallel_size == 1 and num_threads > 1
            and num_threads >= len(os.sched_getaffinity(0)))


def carries_first_token(outputs: EngineCoreOutputs) -> bool:
    # first_scheduled_time comes with a request's first output only (scheduler.py).
    return any(o.new_token_ids and o.first_scheduled_time is not None for o in outputs.outputs)


class SpareCore:
    """Every call runs on the core's thread, which the steps' OpenMP team belongs to (torch's
    thread count is that thread's): before_step, the step, restore (in a finally), after_step."""

    def __init__(self, num_threads: int, enabled: bool) -> None:
        self.num_threads = num_threads  # the steps' own
        self.enabled = enabled
        self._after_first = False  # the step before carried a first token, at low load
        self._reduced = False  # the step under way runs on num_threads - 1

    def before_step(self, decodes_only: Callable[[], bool]) -> None:
        """decodes_only is asked only after a first token (it looks at every running request)."""
        if self._after_first and decodes_only():
            torch.set_num_threads(self.num_threads - 1)
            self._reduced = True
        self._after_first = False

    def restore(self) -> None:
        """After the step, however it ended: whatever the thread does next has every thread."""
        if self._reduced:
            torch.set_num_threads(self.num_threads)
            self._reduced = False

    def after_step(self, outputs: EngineCoreOutputs, short: bool, num_unfinished: int) -> None:
        self._after_first = (self.enabled and short and num_unfinished <= LOW_LOAD_REQUESTS
                             and carries_first_token(outputs))
