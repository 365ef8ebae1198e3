"""One GenAI span per OpenAI request ("text_completion MODEL", "chat MODEL"), parent of the
gateway calls it makes.

It starts under the HTTP server span when FastAPI makes one (FastAPI's own telemetry, on when a
tracer provider is set), else under the caller's W3C `traceparent` header, so a trace runs from
the HTTP client through the front into the ring. The engine calls run in threads (the gRPC client
blocks), so each thread attaches the request's context before calling the gateway."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import Request
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from services.common.tracing import context_from_carrier, tracer


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


def in_span_context(span: Span, target: Callable[..., Any]) -> Callable[..., Any]:
    """target, run (in another thread) with span as the current span."""
    ctx = trace.set_span_in_context(span)

    def run(*args: Any) -> Any:
        with _attached(ctx):
            return target(*args)

    return run


@contextmanager
def _attached(ctx: otel_context.Context) -> Iterator[None]:
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)
