"""`strand serve`'s supervisor: a service that exits is started again, after a back-off that
doubles while it keeps dying (1 s, 2 s, 4 s ... up to 30 s) and starts over once it has stayed up
for a minute. The ring reconnects by itself, so the other services keep running."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from strand.services.launch import Stack

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
STABLE_AFTER_S = 60.0


@dataclass
class Supervisor:
    stack: Stack
    log: Callable[[str], None] = field(default=lambda line: print(line, file=sys.stderr,
                                                                  flush=True))
    clock: Callable[[], float] = time.monotonic
    _backoff: dict[str, float] = field(default_factory=dict)
    _restart_at: dict[str, float] = field(default_factory=dict)
    _started_at: dict[str, float] = field(default_factory=dict)

    def tick(self) -> list[str]:
        """Check every service once; restart those whose back-off has run out. Returns the
        names (re)started by this call."""
        now = self.clock()
        started: list[str] = []
        for name, process in list(self.stack.processes.items()):
            code = process.poll()
            if code is None:
                self._started_at.setdefault(name, now)
                continue
            if name not in self._restart_at:
                self._schedule(name, code, now)
            elif now >= self._restart_at[name]:
                del self._restart_at[name]
                self.stack.start_async(name)
                self._started_at[name] = now
                self.log(f"strand: {name} restarted")
                started.append(name)
        return started

    def _schedule(self, name: str, code: int, now: float) -> None:
        lived = now - self._started_at.get(name, now)
        backoff = self._backoff.get(name, 0.0)
        backoff = FIRST_BACKOFF_S if lived >= STABLE_AFTER_S or not backoff else min(
            backoff * 2, MAX_BACKOFF_S)
        self._backoff[name] = backoff
        self._restart_at[name] = now + backoff
        self.log(f"strand: {name} exited with code {code}; restarting in {backoff:.0f} s")
