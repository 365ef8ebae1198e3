"""The llm_request span: one per request, from AddRequest to its last output, with the
OpenTelemetry GenAI semantic conventions (gen_ai.operation.name, gen_ai.provider.name,
gen_ai.usage.input_tokens/output_tokens, gen_ai.response.finish_reasons, error.type) and, for
one release, the older names dashboards may still read (gen_ai.system,
gen_ai.usage.prompt_tokens/completion_tokens, gen_ai.request.n).

error.type uses gRPC status names, the vocabulary of the stack's errors: a refused add is its
status (INVALID_ARGUMENT, RESOURCE_EXHAUSTED, ...), an aborted request CANCELLED, and a request
that ended with finish_reason "error" UNAVAILABLE (a stage it depended on was lost: the only way
a request ends so).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from opentelemetry.trace import Span, Status, StatusCode

from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.status import status_of
from strand.services.common.tracing import tracer

PROVIDER = "strand"
# pb.SamplingParams field -> the semantic convention's gen_ai.request.* name.
_PARAM_ATTRIBUTES = {
    "n": "gen_ai.request.choice.count", "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p", "top_k": "gen_ai.request.top_k",
    "max_tokens": "gen_ai.request.max_tokens", "seed": "gen_ai.request.seed",
    "presence_penalty": "gen_ai.request.presence_penalty",
    "frequency_penalty": "gen_ai.request.frequency_penalty",
}
_ERROR_TYPES = {"abort": "CANCELLED", "error": "UNAVAILABLE"}


def error_type(exc: BaseException) -> str:
    """The gRPC status name a failed add answers with (CANCELLED: the caller gave up)."""
    if isinstance(exc, asyncio.CancelledError):
        return "CANCELLED"
    return status_of(exc)[0].name


def operation_name(prompt: pb.Prompt) -> str:
    return "chat" if prompt.WhichOneof("kind") == "chat" else "text_completion"


def start_request_span(request_id: str, prompt: pb.Prompt, params: pb.SamplingParams,
                       model: str | None = None) -> Span:
    attributes: dict[str, str | int | float | list[str]] = {
        "gen_ai.request.id": request_id,
        "gen_ai.operation.name": operation_name(prompt),
        "gen_ai.provider.name": PROVIDER,
        "gen_ai.system": PROVIDER,  # the older name of gen_ai.provider.name
    }
    if model:
        attributes["gen_ai.request.model"] = model
    for field, name in _PARAM_ATTRIBUTES.items():
        if params.HasField(field):
            attributes[name] = getattr(params, field)
    if params.HasField("n"):
        attributes["gen_ai.request.n"] = params.n  # older name
    if params.stop:
        attributes["gen_ai.request.stop_sequences"] = list(params.stop)
    return tracer().start_span("llm_request", attributes=attributes)


def fail_request_span(span: Span, exc: BaseException) -> None:
    """The request never got in (refused, or the stages failed): ERROR, and why."""
    span.record_exception(exc)
    span.set_attribute("error.type", error_type(exc))
    span.set_status(Status(StatusCode.ERROR, str(exc) or type(exc).__name__))
    span.end()


def end_request_span(span: Span, request_id: str, num_prompt_tokens: int,
                     num_completion_tokens: int, finish_reasons: Mapping[int, str],
                     output: pb.RequestOutput | None, started: float) -> None:
    """Usage, finish reasons (one per completion, by index), latencies and the first token as
    an event, then the status: ERROR with error.type for "error" and "abort" endings."""
    reasons = [finish_reasons[i] for i in sorted(finish_reasons)]
    span.set_attribute("gen_ai.response.id", request_id)
    span.set_attribute("gen_ai.usage.input_tokens", num_prompt_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", num_completion_tokens)
    span.set_attribute("gen_ai.usage.prompt_tokens", num_prompt_tokens)  # older names
    span.set_attribute("gen_ai.usage.completion_tokens", num_completion_tokens)
    span.set_attribute("gen_ai.response.finish_reasons", reasons)
    _set_latencies(span, output, started)
    ending = next((r for r in ("error", "abort") if r in reasons), None)
    if ending is not None:
        span.set_attribute("error.type", _ERROR_TYPES[ending])
        message = output.error if output is not None and output.HasField("error") else ""
        span.set_status(Status(StatusCode.ERROR, message or f"request ended with {ending}"))
    span.end()


def _set_latencies(span: Span, output: pb.RequestOutput | None, started: float) -> None:
    if output is None or not output.HasField("metrics"):
        span.set_attribute("gen_ai.latency.e2e", time.time() - started)
        return
    m = output.metrics
    end = m.finished_time if m.HasField("finished_time") else time.time()
    span.set_attribute("gen_ai.latency.e2e", end - m.arrival_time)
    if m.HasField("first_scheduled_time"):
        span.set_attribute("gen_ai.latency.time_in_queue", m.first_scheduled_time - m.arrival_time)
    if m.HasField("first_token_time"):
        span.set_attribute("gen_ai.latency.time_to_first_token",
                           m.first_token_time - m.arrival_time)


def add_preemption_events(span: Span, output: pb.RequestOutput, num_reported: int) -> int:
    """A "strand.preemption" event at each preemption the engine reported since the last
    output (RequestMetrics.preemption_times holds them all); returns how many there are now."""
    times = output.metrics.preemption_times if output.HasField("metrics") else []
    for when in times[num_reported:]:
        span.add_event("strand.preemption", timestamp=int(when * 1e9))
    return max(num_reported, len(times))


def add_first_token_event(span: Span, output: pb.RequestOutput) -> None:
    """The first output with tokens: an event at the engine step that produced the token
    (when the output says; else now), so an aborted request shows it too."""
    attributes: dict[str, float] = {}
    timestamp: int | None = None
    if output.HasField("metrics") and output.metrics.HasField("first_token_time"):
        m = output.metrics
        attributes["gen_ai.latency.time_to_first_token"] = m.first_token_time - m.arrival_time
        timestamp = int(m.first_token_time * 1e9)
    span.add_event("gen_ai.first_token", attributes, timestamp=timestamp)
