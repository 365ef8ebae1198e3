"""The gateway's metrics: requests as the front door sees them. The engine and detokenizer
stages export the engine-timed latencies under vLLM's names; these add what only the gateway
knows: requests refused before they got in, aborts and stage-loss errors as clients saw them,
and latencies that include the trip around the ring."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from strand.engine_core.metrics.request_metrics import FINISH_REASONS, LATENCY_BUCKETS, TTFT_BUCKETS
from strand.services.gateway.request_span import error_type


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry, num_live: Callable[[], int]) -> None:
        Gauge("strand:gateway_num_requests_live", "Requests added here and not yet ended.",
              registry=registry).set_function(num_live)
        self._requests = Counter(
            "strand:gateway_requests", "AddRequest and Generate calls by outcome: added, or "
            "the gRPC status they were refused with.", ["outcome"], registry=registry)
        self._requests.labels(outcome="added")
        finished = Counter("strand:gateway_request_finished", "Requests ended, by the finish "
                           "reason their client saw (one per completion).",
                           ["finished_reason"], registry=registry)
        self._finished = {r: finished.labels(finished_reason=r) for r in FINISH_REASONS}
        self.first_output = Histogram(
            "strand:gateway_time_to_first_output_seconds", "AddRequest to the first output "
            "with tokens reaching the gateway.", buckets=TTFT_BUCKETS, registry=registry)
        self.e2e = Histogram("strand:gateway_e2e_request_latency_seconds",
                             "AddRequest to the request's end at the gateway.",
                             buckets=LATENCY_BUCKETS, registry=registry)

    def added(self) -> None:
        self._requests.labels(outcome="added").inc()

    def refused(self, exc: BaseException) -> None:
        self._requests.labels(outcome=error_type(exc)).inc()

    def finished(self, finish_reasons: list[str], latency: float) -> None:
        for reason in finish_reasons:
            counter = self._finished.get(reason)
            if counter is not None:
                counter.inc()
        self.e2e.observe(max(0.0, latency))
