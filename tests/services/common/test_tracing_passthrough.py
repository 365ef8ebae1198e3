"""A stage that records no spans still passes its caller's trace on, as the no-op tracer would,
through server_span's fast path."""

from __future__ import annotations

import pytest
from opentelemetry import context as otel_context
from opentelemetry.trace import SpanKind

from strand.services.common.tracing import (
    carrier_from_context,
    context_from_carrier,
    server_span,
    spans_recorded,
    tracer,
)

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

pytestmark = pytest.mark.skipif(spans_recorded(), reason="a tracer provider is set here")


def _sent_on_by_the_noop_tracer(carrier: dict[str, str]) -> dict[str, str]:
    with tracer().start_as_current_span("x", context=context_from_carrier(carrier),
                                        kind=SpanKind.SERVER):
        return carrier_from_context()


@pytest.mark.parametrize("carrier", [{"traceparent": TRACEPARENT}, {}])
def test_the_body_sends_on_what_the_noop_tracer_would(carrier: dict[str, str]) -> None:
    with server_span("strand.v1.Test/x", context_from_carrier(carrier)) as span:
        sent = carrier_from_context()
        span.set_attribute("a", 1)  # a span's calls are accepted and dropped
    assert sent == _sent_on_by_the_noop_tracer(carrier)
    assert ("traceparent" in sent) == bool(carrier)
    assert carrier_from_context() == {}  # the caller's context is current only inside


def test_an_untraced_carrier_is_the_empty_context() -> None:
    assert context_from_carrier({}) == otel_context.Context()


def test_an_error_in_the_body_leaves_and_restores_the_context() -> None:
    with pytest.raises(ValueError, match="bad"):
        with server_span("strand.v1.Test/x", context_from_carrier({"traceparent": TRACEPARENT})):
            raise ValueError("bad")
    assert carrier_from_context() == {}
