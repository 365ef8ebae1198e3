"""When the auto-stepping engine should hold its next step for more adds.

A burst of requests (a client opening many streams at once) arrives as one add message each.
Stepped at once, each add would wait for the step before it on the core's one thread, and the
burst would join one step per request; held until the adds pause, it joins one step together, as
a loop that adds them all and then steps.

Every add holds the next step until adds have paused for ADD_QUIET_S, a lone one too. Stepping a
lone add at once was measured (benchmarks/ring_overhead.py, the standard model, 2 threads on an
idle 2-core machine, 2026-11-25) and lost on both counts: TTFT added by the ring 13.5 ms against
10.7 ms with the hold, throughput 0.85x in-process against 0.92x. On a small machine the step,
started at once, takes both cores from the stages still handling that add (the tokenizer's and
the gateway's answers), and the first step of a burst runs one request alone.
"""

from __future__ import annotations

# The held step waits for a pause in adds this long.
ADD_QUIET_S = 0.002
# A sustained stream of adds delays a step by at most this.
MAX_ADD_HOLD_S = 0.05


class AddBursts:
    def __init__(self, quiet_s: float = ADD_QUIET_S, max_hold_s: float = MAX_ADD_HOLD_S) -> None:
        self.quiet_s = quiet_s
        self.max_hold_s = max_hold_s
        self._last_add = float("-inf")

    def note_add(self, now: float) -> None:
        self._last_add = now

    def hold(self, now: float, held_since: float) -> bool:
        """Whether a step about to run at `now` (first held at `held_since`) should wait."""
        return now - self._last_add < self.quiet_s and now - held_since < self.max_hold_s
