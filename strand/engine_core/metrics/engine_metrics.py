"""The engine core's metrics: scheduler state, KV cache, prefix cache, tokens per step,
preemptions. Recorded once per step from the same data as the --log-stats line (the scheduler's
SchedulerStats and the step's SchedulerOutput), so the two never disagree."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge as PromGauge
from prometheus_client import Histogram as PromHistogram

from strand.engine_core.core.engine_io import EngineCoreOutput
from strand.engine_core.core.sched_output import SchedulerOutput
from strand.engine_core.core.scheduler import Scheduler
from strand.engine_core.core.stats import SchedulerStats
from strand.engine_core.spec_decode.stats import SpecDecodingStats
from strand.engine_core.stats_logger import prompt_tokens_of

P = "strand:"


def iteration_token_buckets(max_num_batched_tokens: int) -> list[float]:
    """Powers of two up to the step's token budget (a step never computes more)."""
    buckets = [1.0]
    while buckets[-1] * 2 < max_num_batched_tokens:
        buckets.append(buckets[-1] * 2)
    return [*buckets, float(max_num_batched_tokens)]


class EngineMetrics:
    """Gauges read the scheduler when scraped (a waiting request shows before any step);
    counters and histograms move in observe_step()."""

    def __init__(self, registry: CollectorRegistry, model_name: str, scheduler: Scheduler,
                 max_num_batched_tokens: int, cache_info: dict[str, str] | None = None) -> None:
        self.scheduler = scheduler
        labels = {"model_name": model_name}
        names = list(labels)
        if cache_info is not None:
            # vLLM's cache_config_info: the KV cache's configuration as labels of a constant 1,
            # so a dashboard can show (and join on) what each engine's cache is.
            info = {**labels, **cache_info}
            PromGauge(P + "cache_config_info", "The KV cache's configuration (labels; value 1).",
                      list(info), registry=registry).labels(**info).set(1)

        def gauge(name: str, doc: str) -> PromGauge:
            return PromGauge(P + name, doc, names, registry=registry).labels(**labels)

        def counter(name: str, doc: str) -> PromCounter:
            return PromCounter(P + name, doc, names, registry=registry).labels(**labels)

        # Read without the core's thread: len() and an int read are atomic under the GIL.
        gauge("num_requests_running", "Requests in the running batch.").set_function(
            lambda: len(self.scheduler.running))
        gauge("num_requests_waiting", "Requests waiting to run (preempted ones included)."
              ).set_function(lambda: len(self.scheduler.waiting))
        gauge("kv_cache_usage_perc", "Fraction of KV cache blocks held by requests "
              "(1 = 100%).").set_function(lambda: self.scheduler.kv_cache_manager.usage)
        self.prefix_hit_rate = gauge(
            "prefix_cache_hit_rate", "Prefix cache hit rate over the last 1000 requests "
            "(tokens served from the cache / tokens looked up).")
        self.prefix_queries = counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache (first "
            "admissions; a preempted request's second lookup is not counted).")
        self.prefix_hits = counter("prefix_cache_hits",
                                   "Of prefix_cache_queries, tokens served from the cache.")
        self.preemptions = counter("num_preemptions", "Requests preempted (to be recomputed).")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens computed (prefill).")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self.iteration_tokens = PromHistogram(
            P + "iteration_tokens_total", "Tokens computed per engine step.", names,
            buckets=iteration_token_buckets(max_num_batched_tokens), registry=registry,
        ).labels(**labels)
        # Last seen totals: the scheduler keeps totals, Prometheus counters take increments.
        self._queries = self._hits = self._num_preemptions = 0
        self.spec = (SpecDecodeMetrics(registry, labels)
                     if scheduler.proposer is not None else None)

    def observe_step(self, stats: SchedulerStats, scheduler_output: SchedulerOutput | None,
                     outputs: Sequence[EngineCoreOutput]) -> None:
        """One finished step: scheduler_output is None when it computed nothing."""
        prefix = stats.prefix_cache_totals
        self.prefix_queries.inc(prefix.queries - self._queries)
        self.prefix_hits.inc(prefix.hits - self._hits)
        self._queries, self._hits = prefix.queries, prefix.hits
        self.prefix_hit_rate.set(stats.prefix_cache_recent_hit_rate)
        self.preemptions.inc(max(0, stats.num_preemptions - self._num_preemptions))
        self._num_preemptions = stats.num_preemptions
        self.prompt_tokens.inc(prompt_tokens_of(scheduler_output))
        self.generation_tokens.inc(sum(len(o.new_token_ids) for o in outputs))
        if scheduler_output is not None and scheduler_output.total_num_scheduled_tokens:
            self.iteration_tokens.observe(scheduler_output.total_num_scheduled_tokens)
        if self.spec is not None and stats.spec_decoding is not None:
            self.spec.observe(stats.spec_decoding)


class SpecDecodeMetrics:
    """vLLM's spec_decode_* counters: drafts, drafted and accepted tokens, accepted per draft
    position (acceptance rate = accepted / drafted; mean acceptance length = 1 + accepted /
    drafts)."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        names = list(labels)
        self._labels = labels

        def counter(name: str, doc: str) -> PromCounter:
            return PromCounter(P + name, doc, names, registry=registry).labels(**labels)

        self.drafts = counter("spec_decode_num_drafts", "Request-steps that verified a draft.")
        self.draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.accepted = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.per_pos = PromCounter(P + "spec_decode_num_accepted_tokens_per_pos",
                                   "Draft tokens accepted, by position in the draft.",
                                   [*names, "position"], registry=registry)
        self._last = SpecDecodingStats()

    def observe(self, stats: SpecDecodingStats) -> None:
        last = self._last
        self.drafts.inc(stats.num_drafts - last.num_drafts)
        self.draft_tokens.inc(stats.num_draft_tokens - last.num_draft_tokens)
        self.accepted.inc(stats.num_accepted_tokens - last.num_accepted_tokens)
        for pos, count in enumerate(stats.accepted_per_pos):
            before = last.accepted_per_pos[pos] if pos < len(last.accepted_per_pos) else 0
            if count > before:
                self.per_pos.labels(**self._labels, position=str(pos)).inc(count - before)
        self._last = stats.copy()
