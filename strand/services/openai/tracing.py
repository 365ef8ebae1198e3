"""One GenAI span per OpenAI request ("text_completion MODEL", "chat MODEL"), parent of the
gateway calls it makes.

It starts under the HTTP server span when FastAPI makes one (FastAPI's own telemetry, on when a
tracer provider is set), else under the caller's W3C `traceparent` header, so a trace runs from
the HTTP client through the front into the ring. Each engine request's task makes this span the
current one before it calls the gateway (streams.py), so the call carries its context."""

from __future__ import annotations

from fastapi import Request
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from strand.services.common.tracing import context_from_carrier, tracer


def start_request_span(request: Request, operation: str, model: str) -> Span:
    """Started here, ended by the caller when the response is complete (a stream outlives the
    handler). operation: "text_completion" or "chat" (gen_ai.operation.name)."""
    parent = otel_context.get_current()
    if not trace.get_current_span(parent).get_span_context().is_valid:
        parent = context_from_carrier({k: v for k, v in request.headers.items()
                                       if k in ("traceparent", "tracestate")})
    return tracer().start_span(
        f"{operation} {model}", context=parent, kind=SpanKind.INTERNAL,
        attributes={"gen_ai.operation.name": operation, "gen_ai.provider.name": "strand",
                    "gen_ai.request.model": model, "url.path": request.url.path})


def end_request_span(span: Span, status: int, error: BaseException | None = None) -> None:
    span.set_attribute("strand.http.status_code", status)
    if error is not None:
        span.set_attribute("error.type", type(error).__name__)
        span.set_status(Status(StatusCode.ERROR, str(error)[:200]))
    span.end()
