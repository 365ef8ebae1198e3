"""OpenTelemetry setup: OTLP/gRPC export, W3C context in gRPC metadata and in stream messages.

With no endpoint (flag or OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT) spans are not recorded, but
incoming context is still passed on, so a traced caller's trace stays whole through the stack.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import extract, inject
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from strand import envs

_provider: object | None = None
# The OTLP exporter's logger warns on every retry (every 1-4 s while nothing listens).
_EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.grpc.exporter"


class ExportFailureFilter(logging.Filter):
    """Lets the first export failure through (saying later ones are quiet), drops the rest until
    an export succeeds again (reset()); the exporter keeps retrying meanwhile."""

    _PREFIXES = ("Transient error", "Failed to export")

    def __init__(self) -> None:
        super().__init__()
        self.reported = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(self._PREFIXES):
            return True
        if self.reported:
            return record.levelno < logging.WARNING or logging.getLogger().isEnabledFor(
                logging.DEBUG)
        self.reported = True
        record.msg = f"{record.msg} (retrying quietly; the next failures are not logged)"
        return True

    def reset(self) -> None:
        self.reported = False


_export_filter = ExportFailureFilter()


def quiet_export_failures() -> ExportFailureFilter:
    """Install (once) the filter on the OTLP exporter's logger; returns it."""
    logger = logging.getLogger(_EXPORTER_LOGGER)
    if _export_filter not in logger.filters:
        logger.addFilter(_export_filter)
    return _export_filter


def init_tracing(service_name: str, endpoint: str | None = None) -> None:
    """Export spans of this process as `service_name` to the OTLP/gRPC `endpoint`."""
    global _provider
    endpoint = endpoint or envs.otlp_traces_endpoint()
    if not endpoint or _provider is not None:
        return
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult

    service = envs.otel_service_name() or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    insecure = not endpoint.startswith("https://")
    quiet_export_failures()

    class QuietExporter(OTLPSpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            result = super().export(spans)
            if result == SpanExportResult.SUCCESS:
                _export_filter.reset()  # an outage after this one is reported again
            return result

    exporter = QuietExporter(endpoint=endpoint, insecure=insecure)
    # Short delay: a process may be stopped soon after its last span.
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
    trace.set_tracer_provider(provider)
    _provider = provider


def shutdown_tracing() -> None:
    """Flush spans still buffered (called on shutdown)."""
    global _provider
    provider = _provider
    if provider is not None:
        provider.force_flush()  # type: ignore[attr-defined]
        provider.shutdown()  # type: ignore[attr-defined]
    _provider = None


def tracer() -> trace.Tracer:
    return trace.get_tracer("strand")


def carrier_from_context(ctx: otel_context.Context | None = None) -> dict[str, str]:
    """The W3C headers (traceparent, tracestate) of ctx, or of the current context."""
    carrier: dict[str, str] = {}
    inject(carrier, context=ctx)
    return carrier


def context_from_carrier(carrier: Mapping[str, str]) -> otel_context.Context:
    if not carrier:  # an untraced caller: what extract returns for it, without the parsing
        return otel_context.Context()
    return extract(dict(carrier))


def context_from_metadata(metadata: Sequence[tuple[str, str | bytes]] | None
                          ) -> otel_context.Context:
    carrier = {k: v.decode() if isinstance(v, bytes) else v for k, v in (metadata or ())}
    return extract(carrier)


def metadata_from_context() -> list[tuple[str, str]]:
    return list(carrier_from_context().items())


def spans_recorded() -> bool:
    """Whether this process records spans: a tracer provider was set (init_tracing, or the
    program that embeds the services). Until one is, the API's tracers are no-ops."""
    return not isinstance(trace.get_tracer_provider(),
                          (trace.ProxyTracerProvider, trace.NoOpTracerProvider))


@contextmanager
def server_span(name: str, parent: otel_context.Context,
                attributes: Mapping[str, object] | None = None) -> Iterator[Span]:
    """A SERVER span under the caller's context, marked as an error when the body raises.

    When nothing records spans, the caller's context is only made current, so that what the
    body sends on carries the caller's trace: what the no-op tracer's span amounts to, without
    its layers of context managers, which cost a stage a sizable share of its CPU per message
    after an idle gap (py-spy of the detokenizer under lone requests)."""
    if not spans_recorded():
        token = otel_context.attach(parent)
        try:
            yield trace.get_current_span(parent)
        finally:
            otel_context.detach(token)
        return
    with tracer().start_as_current_span(name, context=parent, kind=SpanKind.SERVER,
                                        attributes=dict(attributes or {}),  # type: ignore[arg-type]
                                        record_exception=True,
                                        set_status_on_exception=True) as span:
        yield span


def end_span_with_error(span: Span, message: str) -> None:
    span.set_status(Status(StatusCode.ERROR, message))
    span.end()
