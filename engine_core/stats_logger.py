"""Throughput over a sliding window, and the periodic stats log line (vLLM's LoggingStatLogger)."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence

from engine_core.core.engine_io import EngineCoreOutput

logger = logging.getLogger("strand.stats")


class ThroughputMeter:
    """Generated tokens per second over the last `window_s` seconds."""

    def __init__(self, window_s: float = 10.0) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self.total_tokens = 0

    def add(self, num_tokens: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self._events.append((now, num_tokens))
        self.total_tokens += num_tokens
        self._trim(now)

    def rate(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        self._trim(now)
        if len(self._events) < 2:
            return 0.0
        span = now - self._events[0][0]
        tokens = sum(n for _, n in list(self._events)[1:])
        return tokens / span if span > 0 else 0.0

    def _trim(self, now: float) -> None:
        while self._events and now - self._events[0][0] > self.window_s:
            self._events.popleft()


class StatsLogger:
    """Logs one line every `interval_s`: running/waiting, KV usage, prefix hit rate, tokens/s."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self._last_log = time.monotonic()

    def record(self, stats: dict[str, float], outputs: Sequence[EngineCoreOutput]) -> None:
        now = time.monotonic()
        if now - self._last_log < self.interval_s:
            return
        self._last_log = now
        logger.info(
            "running: %d reqs, waiting: %d reqs, KV cache usage: %.1f%%, "
            "prefix cache hit rate: %.1f%%, generation throughput: %.1f tokens/s",
            stats["num_running_reqs"], stats["num_waiting_reqs"],
            100 * stats["kv_cache_usage"], 100 * stats["prefix_cache_hit_rate"],
            stats.get("generation_tokens_per_s", 0.0))
