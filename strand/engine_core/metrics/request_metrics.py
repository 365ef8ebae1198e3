"""Per-request metrics, recorded where a request's outputs are assembled (the output processor:
in process, or the detokenizer stage): latencies from RequestMetrics' timestamps (the engine's
step times), token counts, and how each sequence finished."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client import Counter as PromCounter
from prometheus_client import Histogram as PromHistogram

from strand.engine_core.outputs import RequestMetrics

P = "strand:"
# vLLM's buckets, so that dashboards built for vllm:* read these the same way.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0]
LATENCY_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]
FINISH_REASONS = ("stop", "length", "abort", "error")


def token_buckets(max_value: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to max_value (vLLM's build_1_2_5_buckets)."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(float(value))
        exponent += 1


class RequestStatsRecorder:
    def __init__(self, registry: CollectorRegistry, model_name: str,
                 max_model_len: int) -> None:
        labels = {"model_name": model_name}
        names = list(labels)

        def histogram(name: str, doc: str, buckets: list[float]) -> PromHistogram:
            return PromHistogram(P + name, doc, names, buckets=buckets,
                                 registry=registry).labels(**labels)

        self.ttft = histogram("time_to_first_token_seconds",
                              "Arrival to the step that produced the first token.", TTFT_BUCKETS)
        self.inter_token = histogram("inter_token_latency_seconds",
                                     "Time between a request's consecutive token steps.",
                                     ITL_BUCKETS)
        self.time_per_output_token = histogram(
            "request_time_per_output_token_seconds",
            "Per request: decode time / (generated tokens - 1).", ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to finish.",
                             LATENCY_BUCKETS)
        self.queue = histogram("request_queue_time_seconds", "Arrival to first scheduled.",
                               LATENCY_BUCKETS)
        self.prefill = histogram("request_prefill_time_seconds",
                                 "First scheduled to first token.", LATENCY_BUCKETS)
        self.decode = histogram("request_decode_time_seconds", "First token to last token.",
                                LATENCY_BUCKETS)
        self.inference = histogram("request_inference_time_seconds",
                                   "First scheduled to last token.", LATENCY_BUCKETS)
        self.prompt_tokens = histogram("request_prompt_tokens", "Prompt tokens per request.",
                                       token_buckets(max_model_len))
        self.generation_tokens = histogram("request_generation_tokens",
                                           "Generated tokens per request (all n sequences).",
                                           token_buckets(max_model_len))
        success = PromCounter(P + "request_success", "Finished sequences by finish reason "
                              "(each of n counts).", [*names, "finished_reason"],
                              registry=registry)
        # Every reason exported from the start: a rate over a series that appears late is wrong.
        self.success = {reason: success.labels(finished_reason=reason, **labels)
                        for reason in FINISH_REASONS}

    def first_token(self, metrics: RequestMetrics) -> None:
        if metrics.first_token_time is not None:
            self.ttft.observe(max(0.0, metrics.first_token_time - metrics.arrival_time))

    def next_token(self, previous_token_time: float, timestamp: float) -> None:
        self.inter_token.observe(max(0.0, timestamp - previous_token_time))

    def next_tokens(self, latencies: Sequence[float]) -> None:
        """Many inter-token latencies at once (the steps whose tokens the engine stage held)."""
        observe_many(self.inter_token, latencies)

    def finished(self, metrics: RequestMetrics, num_prompt_tokens: int,
                 sequence_lengths: list[int], finish_reasons: Iterable[str | None]) -> None:
        """One request ended (all of its n sequences, with these lengths and reasons): its
        latencies, sizes and finish reasons."""
        for reason in finish_reasons:
            counter = self.success.get(reason or "")
            if counter is not None:
                counter.inc()
        self.prompt_tokens.observe(num_prompt_tokens)
        self.generation_tokens.observe(sum(sequence_lengths))
        # The longest sequence decoded from the first token step to the last one.
        longest = max(sequence_lengths, default=0)
        arrival = metrics.arrival_time
        if metrics.finished_time is not None:
            self.e2e.observe(max(0.0, metrics.finished_time - arrival))
        scheduled, first, last = (metrics.first_scheduled_time, metrics.first_token_time,
                                  metrics.last_token_time)
        if scheduled is not None:
            self.queue.observe(max(0.0, scheduled - arrival))
        if scheduled is not None and first is not None:
            self.prefill.observe(max(0.0, first - scheduled))
        if first is not None and last is not None:
            self.decode.observe(max(0.0, last - first))
            if longest > 1:
                self.time_per_output_token.observe(max(0.0, last - first) / (longest - 1))
        if scheduled is not None and last is not None:
            self.inference.observe(max(0.0, last - scheduled))


def observe_many(histogram: PromHistogram, values: Sequence[float]) -> None:
    """histogram.observe(v) for each value. observe takes two locks a value (the sum, a bucket);
    a request's held steps come 100+ values at once, so here they are counted into their buckets
    first and each bucket touched is incremented once (a third of the time, on the detokenizer's
    last step of a batch). Through prometheus_client's child fields where they are as in its
    releases so far (0.20-0.26); one observe a value otherwise."""
    if not values:
        return
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for value in values:
            histogram.observe(value)
        return
    counts: dict[int, int] = {}
    for value in values:
        # The first bucket whose bound is >= value (observe's `amount <= bound`); the last bound
        # is +Inf.
        index = bisect_left(bounds, value)
        counts[index] = counts.get(index, 0) + 1
    total.inc(sum(values))
    for index, count in counts.items():
        buckets[index].inc(count)
