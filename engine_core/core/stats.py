"""Scheduler and prefix-cache counters; rates are computed from them, never stored."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class PrefixCacheStats:
    """Counts since start or the last reset_prefix_cache()."""

    requests: int = 0  # lookups (a request resumed after preemption looks up again)
    queries: int = 0  # tokens looked up
    hits: int = 0  # of those, tokens served from the cache

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def record(self, num_queried: int, num_hit: int) -> None:
        self.requests += 1
        self.queries += num_queried
        self.hits += num_hit

    def copy(self) -> PrefixCacheStats:
        return PrefixCacheStats(self.requests, self.queries, self.hits)


@dataclass(slots=True)
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0  # preempted ones included
    kv_cache_usage: float = 0.0  # fraction of allocatable blocks held by requests, in [0, 1]
    prefix_cache_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    num_preemptions: int = 0  # since start
    # Tokens a KV connector supplied on device misses; None without a connector.
    connector_prefix_cache_stats: PrefixCacheStats | None = None
