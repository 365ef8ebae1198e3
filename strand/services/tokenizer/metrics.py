"""The tokenizer stage's metrics: how long tokenizing (and chat templating) takes, and what
became of each request it was handed (added, or refused with which status)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from strand.services.common.status import status_of

TOKENIZE_BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0]


class TokenizerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.tokenize_time = Histogram(
            "strand:tokenize_time_seconds", "InputProcessor.process per request: chat "
            "template, tokenizing, validation.", buckets=TOKENIZE_BUCKETS, registry=registry)
        self._requests = Counter(
            "strand:tokenizer_requests", "Requests handed to this stage, by outcome: added (in "
            "the engine) or the gRPC status they were refused with.", ["outcome"],
            registry=registry)
        self._requests.labels(outcome="added")  # exported from the start, at 0

    def added(self) -> None:
        self._requests.labels(outcome="added").inc()

    def refused(self, exc: BaseException) -> None:
        code, _ = status_of(exc)
        self._requests.labels(outcome=code.name).inc()
