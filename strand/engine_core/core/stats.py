"""Scheduler and prefix-cache counters; rates are computed from them, never stored."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from strand.engine_core.spec_decode.stats import SpecDecodingStats


@dataclass(slots=True)
class PrefixCacheStats:
    """Counts since start or the last reset_prefix_cache().

    requests/queries/hits count first admissions only; a request resuming after preemption
    looks its prefix up again, and that lookup goes to the preempted_* counters (vLLM's split),
    so recomputation does not inflate the hit rate.
    """

    requests: int = 0  # first admissions looked up
    queries: int = 0  # tokens looked up
    hits: int = 0  # of those, tokens served from the cache
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def record(self, num_queried: int, num_hit: int, preempted: bool = False) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_queried
            self.preempted_hits += num_hit
        else:
            self.requests += 1
            self.queries += num_queried
            self.hits += num_hit

    def copy(self) -> PrefixCacheStats:
        return PrefixCacheStats(self.requests, self.queries, self.hits, self.preempted_requests,
                                self.preempted_queries, self.preempted_hits)


class CachingMetrics:
    """Hit rate over the most recent max_recent_requests requests (vLLM's CachingMetrics).

    observe() takes the stats of one interval (one lookup, or one step); an interval with no
    requests is not kept, so idle steps do not push useful history out of the window.
    """

    def __init__(self, max_recent_requests: int = 1000) -> None:
        if max_recent_requests < 1:
            raise ValueError(f"max_recent_requests must be >= 1, got {max_recent_requests}")
        self.max_recent_requests = max_recent_requests
        self.aggregated_requests = 0
        self.aggregated_query_total = 0
        self.aggregated_query_hit = 0
        self._intervals: deque[tuple[int, int, int]] = deque()

    def observe(self, stats: PrefixCacheStats) -> None:
        if stats.requests == 0:
            return
        self._intervals.append((stats.requests, stats.queries, stats.hits))
        self.aggregated_requests += stats.requests
        self.aggregated_query_total += stats.queries
        self.aggregated_query_hit += stats.hits
        # The newest interval stays even when it alone exceeds the window.
        while len(self._intervals) > 1 and self.aggregated_requests > self.max_recent_requests:
            requests, queries, hits = self._intervals.popleft()
            self.aggregated_requests -= requests
            self.aggregated_query_total -= queries
            self.aggregated_query_hit -= hits

    def reset(self) -> None:
        self.aggregated_requests = self.aggregated_query_total = self.aggregated_query_hit = 0
        self._intervals.clear()

    @property
    def empty(self) -> bool:
        return not self._intervals

    @property
    def hit_rate(self) -> float:
        if self.aggregated_query_total == 0:
            return 0.0
        return self.aggregated_query_hit / self.aggregated_query_total


@dataclass(slots=True)
class SchedulerStats:
    num_running_reqs: int = 0
    num_waiting_reqs: int = 0  # preempted ones included
    kv_cache_usage: float = 0.0  # fraction of allocatable blocks held by requests, in [0, 1]
    prefix_cache_stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    # Hit rate of the last 1000 first admissions (vLLM's windowed metric).
    prefix_cache_recent_hit_rate: float = 0.0
    num_preemptions: int = 0  # since start
    # prefix_cache_stats since start, never reset (what Prometheus counters are made of).
    prefix_cache_totals: PrefixCacheStats = field(default_factory=PrefixCacheStats)
    # Tokens a KV connector supplied on device misses; None without a connector.
    connector_prefix_cache_stats: PrefixCacheStats | None = None
    # Drafts proposed and accepted since start; None without speculative decoding.
    spec_decoding: SpecDecodingStats | None = None
