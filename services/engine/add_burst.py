"""When the auto-stepping engine should hold its next step for more adds.

A burst of requests (a client opening many streams at once) arrives as one add message each.
Stepped at once, each add would wait for the step before it on the core's one thread, and the
burst would join one step per request; held until the adds pause, it joins one step together, as
a loop that adds them all and then steps. A lone add (none other within ADD_QUIET_S before it)
is not held: its first token should cost what it costs in process, and a request that arrives
while others decode should not delay their next step either. The first add of a burst is thus
stepped alone (one small extra step); the second one marks the burst and the rest join.
"""

from __future__ import annotations

# Adds closer together than this are one burst; the held step waits for a pause this long.
ADD_QUIET_S = 0.002
# A sustained stream of adds delays a step by at most this.
MAX_ADD_HOLD_S = 0.05


class AddBursts:
    def __init__(self, quiet_s: float = ADD_QUIET_S, max_hold_s: float = MAX_ADD_HOLD_S) -> None:
        self.quiet_s = quiet_s
        self.max_hold_s = max_hold_s
        self._last_add = float("-inf")
        self._in_burst = False

    def note_add(self, now: float) -> None:
        self._in_burst = now - self._last_add < self.quiet_s
        self._last_add = now

    def hold(self, now: float, held_since: float) -> bool:
        """Whether a step about to run at `now` (first held at `held_since`) should wait."""
        return (self._in_burst and now - self._last_add < self.quiet_s
                and now - held_since < self.max_hold_s)
