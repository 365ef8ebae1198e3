"""Engine outputs that reached the detokenizer before their request did.

With an auto-stepping engine the tokenizer sends a request's state here and its children to the
engine at the same time (the detokenizer's answer is not waited for: that round trip was on
every request's time to first token). The state nearly always wins (the engine holds its step
for a pause in adds, then computes the prefill), but the two travel on different connections,
so nothing orders them: an output of a request this stage has not heard of is kept here until
the request arrives, and then processed ahead of any later step.

An output of a request that ended here while the engine still ran it is not kept (it is a late
one: an abort or a stop string raced the engine's step); a request the engine itself finished sends
nothing more, so its id may come back at once and be kept for. What is kept is bounded in count and age; a request that never arrives
(its add was refused here and taken back from the engine) leaves its outputs to expire.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from strand.engine_core.core.engine_io import EngineCoreOutput

logger = logging.getLogger(__name__)

# Kept at most this long: far beyond the gap between the two sends of one add.
EARLY_OUTPUT_TTL_S = 30.0
# And at most this many outputs (the oldest go first).
MAX_EARLY_OUTPUTS = 65536


@dataclass(slots=True)
class _Early:
    received: float  # monotonic
    timestamp: float  # the step's iteration timestamp
    output: EngineCoreOutput


class EarlyOutputs:
    def __init__(self, ttl_s: float = EARLY_OUTPUT_TTL_S,
                 max_outputs: int = MAX_EARLY_OUTPUTS) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        if max_outputs < 1:
            raise ValueError(f"max_outputs must be >= 1, got {max_outputs}")
        self.ttl_s = ttl_s
        self.max_outputs = max_outputs
        self._kept: deque[_Early] = deque()  # in arrival order, which is step order
        self.dropped = 0  # expired or pushed out, for the log and the tests

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, outputs: Iterable[EngineCoreOutput], timestamp: float, now: float) -> None:
        self.expire(now)
        for output in outputs:
            self._kept.append(_Early(now, timestamp, output))
        overflow = len(self._kept) - self.max_outputs
        if overflow > 0:
            for _ in range(overflow):
                self._kept.popleft()
            self._dropped(overflow, f"more than {self.max_outputs} were waiting")

    def take(self, request_ids: Iterable[str], now: float
             ) -> list[tuple[float, list[EngineCoreOutput]]]:
        """The kept outputs of these (child) ids, removed, as (step timestamp, outputs) in step
        order."""
        self.expire(now)
        wanted = set(request_ids)
        if not wanted or not self._kept:
            return []
        steps: list[tuple[float, list[EngineCoreOutput]]] = []
        rest: deque[_Early] = deque()
        for early in self._kept:
            if early.output.request_id not in wanted:
                rest.append(early)
            elif steps and steps[-1][0] == early.timestamp:
                steps[-1][1].append(early.output)
            else:
                steps.append((early.timestamp, [early.output]))
        self._kept = rest
        return steps

    def clear(self) -> None:
        """The engine went away: what it sent ahead is void (it aborts everything it had)."""
        self._kept.clear()

    def expire(self, now: float) -> None:
        expired = 0
        while self._kept and now - self._kept[0].received > self.ttl_s:
            self._kept.popleft()
            expired += 1
        if expired:
            self._dropped(expired, f"their requests did not arrive within {self.ttl_s:g} s")

    def _dropped(self, count: int, why: str) -> None:
        self.dropped += count
        logger.warning("dropped %d engine outputs of unknown requests: %s", count, why)
