"""Throughput over a sliding window, and the periodic stats log line (vLLM's LoggingStatLogger)."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence

from strand.engine_core.core.engine_io import EngineCoreOutput
from strand.engine_core.core.sched_output import SchedulerOutput

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


def prompt_tokens_of(sched: SchedulerOutput | None) -> int:
    """Prompt tokens a step computed: new requests' chunks, and any chunk longer than one token
    (a decode step computes one token per request)."""
    if sched is None:
        return 0
    new_ids = {r.req_id for r in sched.scheduled_new_reqs}
    return sum(n for rid, n in sched.num_scheduled_tokens.items() if rid in new_ids or n > 1)


class StatsLogger:
    """vLLM's periodic line, at most once every `interval_s` while there is activity: prompt and
    generation tokens/s over the interval, running/waiting requests, KV usage, prefix hit rate.

    record() counts each step's tokens and logs when due; log_if_due() alone (from a timer) lets
    the last line of a burst, and the idle line after it, appear without a further step. Idle
    intervals after that one log nothing."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self.interval_s = interval_s
        self._last_log = time.monotonic()
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._logged_activity = False  # the last line reported tokens: one idle line follows
        # spec_decode_* totals at the last line (speculative decoding), to report an interval's.
        self._spec_totals = (0.0, 0.0, 0.0)

    def record(self, stats: dict[str, float], outputs: Sequence[EngineCoreOutput],
               scheduler_output: SchedulerOutput | None = None) -> None:
        self.count(prompt_tokens_of(scheduler_output),
                   sum(len(o.new_token_ids) for o in outputs))
        self.log_if_due(stats)

    def count(self, prompt_tokens: int, generation_tokens: int) -> None:
        self._prompt_tokens += prompt_tokens
        self._generation_tokens += generation_tokens

    def log_if_due(self, stats: dict[str, float], now: float | None = None) -> str | None:
        """Log (and return) the line when the interval is up and there is something to say."""
        now = time.monotonic() if now is None else now
        elapsed = now - self._last_log
        if elapsed < self.interval_s:
            return None
        active = bool(self._prompt_tokens or self._generation_tokens or
                      stats["num_running_reqs"] or stats["num_waiting_reqs"])
        if not active and not self._logged_activity:
            self._last_log = now
            return None
        self._logged_activity = active
        return self.log_now(stats, now)

    def log_now(self, stats: dict[str, float], now: float | None = None) -> str:
        """Log (and return) the line whether or not the interval is up (do_log_stats)."""
        now = time.monotonic() if now is None else now
        elapsed = now - self._last_log
        line = format_stats_line(stats, self._prompt_tokens / max(elapsed, 1e-9),
                                 self._generation_tokens / max(elapsed, 1e-9))
        spec = self._spec_interval(stats)
        if spec:
            line += spec
        logger.info("%s", line)
        self._last_log = now
        self._prompt_tokens = self._generation_tokens = 0
        return line


    def _spec_interval(self, stats: dict[str, float]) -> str:
        """", Spec decode: ..." over the interval (vLLM's SpecDecoding metrics line), "" when
        speculative decoding is off or drafted nothing."""
        if "spec_decode_num_drafts" not in stats:
            return ""
        totals = (stats["spec_decode_num_drafts"], stats["spec_decode_num_draft_tokens"],
                  stats["spec_decode_num_accepted_tokens"])
        drafts, drafted, accepted = (now - before
                                     for now, before in zip(totals, self._spec_totals, strict=True))
        self._spec_totals = totals
        if not drafts:
            return ""
        return (f", Spec decode: mean acceptance length {1 + accepted / drafts:.2f}, "
                f"accepted {int(accepted)} of {int(drafted)} draft tokens "
                f"({100 * accepted / drafted:.1f}%)")


def format_stats_line(stats: dict[str, float], prompt_tps: float, generation_tps: float) -> str:
    return (f"Avg prompt throughput: {prompt_tps:.1f} tokens/s, "
            f"Avg generation throughput: {generation_tps:.1f} tokens/s, "
            f"Running: {int(stats['num_running_reqs'])} reqs, "
            f"Waiting: {int(stats['num_waiting_reqs'])} reqs, "
            f"KV cache usage: {100 * stats['kv_cache_usage']:.1f}%, "
            f"Prefix cache hit rate: {100 * stats['prefix_cache_hit_rate']:.1f}%")
