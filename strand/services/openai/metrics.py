"""The OpenAI front's /metrics (vLLM serves its metrics on its API port too): HTTP requests as
the front's clients saw them, by route and status, including those refused before they reached
the gateway (401, 413, 400 for bad JSON), which no stage's metrics see. Routes outside the
front's own are counted as "other", so a client probing paths cannot grow the label set."""

from __future__ import annotations

import time

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from strand.engine_core.metrics.request_metrics import LATENCY_BUCKETS
from strand.services.common.metrics_server import CONTENT_TYPE

ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/models",
                    "/tokenize", "/detokenize", "/health", "/version", "/metrics"})


class FrontMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.requests = Counter("strand:openai_requests", "HTTP requests by route and the "
                                "status answered.", ["route", "status"], registry=self.registry)
        self.duration = Histogram("strand:openai_request_duration_seconds", "An HTTP request's "
                                  "time from its arrival to its response's last byte (a "
                                  "stream's whole length).", ["route"], buckets=LATENCY_BUCKETS,
                                  registry=self.registry)

    def text(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE


class HttpMetrics:
    """Plain ASGI, outermost: every request is counted, whoever answers it."""

    def __init__(self, app: ASGIApp, metrics: FrontMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in ROUTES else "other"
        status = "499"  # no response started: the client left first

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        start = time.perf_counter()
        try:
            await self.app(scope, receive, sending)
        except BaseException:
            if status == "499":
                status = "500"
            raise
        finally:
            self.metrics.requests.labels(route=route, status=status).inc()
            self.metrics.duration.labels(route=route).observe(time.perf_counter() - start)
