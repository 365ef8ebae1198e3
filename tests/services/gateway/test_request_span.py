"""The llm_request span, read back from an in-memory exporter: OpenTelemetry GenAI attributes
(and the older names), finish reasons per completion, the first-token event, and the status of
aborted, errored and refused requests; the gateway's metrics move with the same events."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import grpc
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry

from strand.engine_core.metrics import Counter, Histogram, snapshot
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.status import StageError
from strand.services.gateway import request_span
from strand.services.gateway.live import LiveRequest, error_output
from strand.services.gateway.metrics import GatewayMetrics
from strand.services.gateway.request_span import fail_request_span, start_request_span


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # The module's tracer, not the process-wide provider (which may be set only once).
    monkeypatch.setattr(request_span, "tracer", lambda: provider.get_tracer("test"))
    yield exporter
    provider.shutdown()


def only_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["llm_request"]
    return spans[0]


def live_request(n: int = 1, metrics: GatewayMetrics | None = None) -> LiveRequest:
    span = start_request_span("r1", pb.Prompt(text="hi"), pb.SamplingParams(n=n))
    return LiveRequest(request_id="r1", child_ids=[], span=span, cumulative=False,
                       num_prompt_tokens=7, num_outputs=n, metrics=metrics)


def output(tokens: dict[int, list[int]], reasons: dict[int, str] | None = None,
           first_token_time: float | None = None) -> pb.RequestOutput:
    out = pb.RequestOutput(request_id="r1", finished=bool(reasons))
    for index, ids in tokens.items():
        completion = out.outputs.add(index=index, token_ids=ids)
        if reasons and index in reasons:
            completion.finish_reason = reasons[index]
    out.metrics.arrival_time = 100.0
    out.metrics.first_scheduled_time = 100.5
    if first_token_time is not None:
        out.metrics.first_token_time = first_token_time
    if reasons:
        out.metrics.finished_time = 103.0
    return out


def test_request_attributes_follow_the_gen_ai_conventions(
        exporter: InMemorySpanExporter) -> None:
    prompt = pb.Prompt(chat=pb.ChatMessages(messages=[pb.ChatMessage(role="user",
                                                                      content="hi")]))
    params = pb.SamplingParams(n=2, temperature=0.5, max_tokens=9, top_k=3, stop=["\n"])
    start_request_span("r1", prompt, params, model="/models/tiny").end()
    attrs = only_span(exporter).attributes
    assert attrs is not None
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "strand"
    assert attrs["gen_ai.system"] == "strand"  # the older name, kept for one release
    assert attrs["gen_ai.request.model"] == "/models/tiny"
    assert attrs["gen_ai.request.choice.count"] == 2
    assert attrs["gen_ai.request.n"] == 2
    assert attrs["gen_ai.request.temperature"] == 0.5
    assert attrs["gen_ai.request.max_tokens"] == 9
    assert attrs["gen_ai.request.top_k"] == 3
    assert attrs["gen_ai.request.stop_sequences"] == ("\n",)
    assert attrs["gen_ai.request.id"] == "r1"


def test_text_prompt_is_a_text_completion(exporter: InMemorySpanExporter) -> None:
    start_request_span("r1", pb.Prompt(text="hi"), pb.SamplingParams()).end()
    attrs = only_span(exporter).attributes
    assert attrs is not None and attrs["gen_ai.operation.name"] == "text_completion"
    assert "gen_ai.request.temperature" not in attrs  # unset params are not invented


def test_finished_request_has_usage_finish_reasons_and_first_token_event(
        exporter: InMemorySpanExporter) -> None:
    live = live_request(n=2)
    live.record(output({0: [5], 1: [6]}, first_token_time=101.25))
    live.record(output({0: [7]}, {0: "stop"}))
    final = output({1: [8, 9]}, {1: "length"}, first_token_time=101.25)
    live.record(final)
    live.end_span(final, "length")
    span = only_span(exporter)
    attrs = span.attributes
    assert attrs is not None
    assert attrs["gen_ai.usage.input_tokens"] == 7
    assert attrs["gen_ai.usage.output_tokens"] == 5
    assert attrs["gen_ai.usage.prompt_tokens"] == 7  # older names
    assert attrs["gen_ai.usage.completion_tokens"] == 5
    assert attrs["gen_ai.response.finish_reasons"] == ("stop", "length")  # by completion index
    assert attrs["gen_ai.response.id"] == "r1"
    assert attrs["gen_ai.latency.e2e"] == pytest.approx(3.0)
    assert attrs["gen_ai.latency.time_in_queue"] == pytest.approx(0.5)
    assert attrs["gen_ai.latency.time_to_first_token"] == pytest.approx(1.25)
    assert "error.type" not in attrs
    assert span.status.status_code == StatusCode.UNSET
    events = [e for e in span.events if e.name == "gen_ai.first_token"]
    assert len(events) == 1  # once, at the engine step that made the token
    assert events[0].timestamp == int(101.25 * 1e9)


def test_aborted_request_span_is_an_error_of_type_cancelled(
        exporter: InMemorySpanExporter) -> None:
    live = live_request()
    live.record(output({0: [5]}, first_token_time=101.0))
    live.end_span(None, "abort")
    span = only_span(exporter)
    attrs = span.attributes
    assert attrs is not None
    assert attrs["gen_ai.response.finish_reasons"] == ("abort",)
    assert attrs["error.type"] == "CANCELLED"
    assert attrs["gen_ai.usage.output_tokens"] == 1
    assert span.status.status_code == StatusCode.ERROR
    assert [e.name for e in span.events] == ["gen_ai.first_token"]


def test_errored_request_span_carries_the_reason(exporter: InMemorySpanExporter) -> None:
    live = live_request(n=2)
    ended = error_output("r1", 2, "engine stage is unavailable: gone")
    live.record(ended)
    live.end_span(ended, "error")
    span = only_span(exporter)
    assert span.attributes is not None
    assert span.attributes["error.type"] == "UNAVAILABLE"
    assert span.attributes["gen_ai.response.finish_reasons"] == ("error", "error")
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description == "engine stage is unavailable: gone"
    assert not [e for e in span.events if e.name == "gen_ai.first_token"]


def test_preemptions_become_span_events_at_their_times(
        exporter: InMemorySpanExporter) -> None:
    live = live_request()
    first = output({0: [5]}, first_token_time=101.0)
    first.metrics.preemption_times.append(101.5)
    live.record(first)
    final = output({0: [6]}, {0: "length"}, first_token_time=101.0)
    final.metrics.preemption_times.extend([101.5, 102.5])  # every one so far, each output
    live.record(final)
    live.end_span(final, "length")
    span = only_span(exporter)
    preemptions = [e for e in span.events if e.name == "strand.preemption"]
    assert [e.timestamp for e in preemptions] == [int(101.5 * 1e9), int(102.5 * 1e9)]
    assert span.attributes is not None
    assert span.attributes["strand.request.num_preemptions"] == 2


@pytest.mark.parametrize(("exc", "error_type"), [
    (StageError(grpc.StatusCode.INVALID_ARGUMENT, "max_tokens must be >= 1, got 0"),
     "INVALID_ARGUMENT"),
    (StageError(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full"), "RESOURCE_EXHAUSTED"),
    (asyncio.CancelledError(), "CANCELLED"),
])
def test_refused_request_span_has_error_type(exporter: InMemorySpanExporter,
                                             exc: BaseException, error_type: str) -> None:
    fail_request_span(start_request_span("r1", pb.Prompt(text="hi"), pb.SamplingParams()), exc)
    span = only_span(exporter)
    assert span.attributes is not None and span.attributes["error.type"] == error_type
    assert span.status.status_code == StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]


def test_gateway_metrics_follow_the_request(exporter: InMemorySpanExporter) -> None:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry, lambda: 3)
    live = live_request(n=2, metrics=metrics)
    live.record(output({0: [5], 1: [6]}, first_token_time=101.0))
    live.end_span(None, "abort")
    metrics.refused(StageError(grpc.StatusCode.INVALID_ARGUMENT, "bad"))
    found = {(m.name, tuple(sorted(m.labels.items()))): m for m in snapshot(registry)}
    finished = found[("strand:gateway_request_finished", (("finished_reason", "abort"),))]
    assert isinstance(finished, Counter) and finished.value == 2  # both completions
    refused = found[("strand:gateway_requests", (("outcome", "INVALID_ARGUMENT"),))]
    assert isinstance(refused, Counter) and refused.value == 1
    first = found[("strand:gateway_time_to_first_output_seconds", ())]
    assert isinstance(first, Histogram) and first.count == 1
    e2e = found[("strand:gateway_e2e_request_latency_seconds", ())]
    assert isinstance(e2e, Histogram) and e2e.count == 1
    live_gauge = found[("strand:gateway_num_requests_live", ())]
    assert live_gauge.value == 3  # type: ignore[attr-defined]


def test_prompt_tokens_come_from_the_outputs_when_they_beat_the_add_answer(
        exporter: InMemorySpanExporter) -> None:
    # Auto mode: a short request can end before the tokenizer's answer gives the count.
    live = live_request()
    live.num_prompt_tokens = 0
    out = output({0: [5, 6]}, {0: "length"})
    out.prompt_token_ids.extend([1, 2, 3, 4])
    live.record(out)
    live.end_span(out, "length")
    attrs = only_span(exporter).attributes
    assert attrs is not None and attrs["gen_ai.usage.prompt_tokens"] == 4
