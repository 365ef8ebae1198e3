"""One request, one trace: spans from all four services, linked parent to child."""

from __future__ import annotations

import time

from strand.engine_core.sampling_params import SamplingParams
from strand.services.client import EngineClient
from tests.e2e.otlp_receiver import OtlpReceiver, ReceivedSpan


def _finish(client: EngineClient, request_id: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any(o.request_id == request_id and o.finished for o in client.step()):
            return
        time.sleep(0.05)
    raise AssertionError(f"{request_id} did not finish")


def _llm_request_span(receiver: OtlpReceiver, request_id: str) -> ReceivedSpan:
    found = receiver.wait_for(lambda s: s.name == "llm_request"
                              and s.attributes.get("gen_ai.request.id") == request_id)
    assert len(found) == 1
    return found[0]


def test_one_request_makes_one_trace_across_all_four_services(
        auto_client: EngineClient, otlp_receiver: OtlpReceiver) -> None:
    auto_client.add_request("traced-1", "follow me", SamplingParams(temperature=0.0,
                                                                    max_tokens=3))
    _finish(auto_client, "traced-1")
    root = _llm_request_span(otlp_receiver, "traced-1")
    time.sleep(1.5)  # the stages' batch exporters flush within half a second
    spans = otlp_receiver.trace(root.trace_id)
    services = {s.service for s in spans}
    assert services == {"strand-gateway", "strand-tokenizer", "strand-engine",
                        "strand-detokenizer"}
    ids = {s.span_id for s in spans}
    roots = [s for s in spans if s.parent_span_id not in ids]
    assert [r.name for r in roots] == ["strand.v1.Inference/AddRequest"]
    by_service = {s.service: s for s in spans if s.parent_span_id == root.span_id}
    assert set(by_service) == {"strand-tokenizer", "strand-engine", "strand-detokenizer"}


def test_llm_request_span_has_gen_ai_attributes(auto_client: EngineClient,
                                                otlp_receiver: OtlpReceiver) -> None:
    auto_client.add_request("traced-2", {"prompt_token_ids": [1, 10, 11, 12]},
                            SamplingParams(temperature=0.0, max_tokens=4))
    _finish(auto_client, "traced-2")
    attrs = _llm_request_span(otlp_receiver, "traced-2").attributes
    assert attrs["gen_ai.usage.prompt_tokens"] == 4
    assert attrs["gen_ai.usage.completion_tokens"] == 4
    assert attrs["gen_ai.usage.input_tokens"] == 4  # the current GenAI conventions' names
    assert attrs["gen_ai.usage.output_tokens"] == 4
    assert attrs["gen_ai.operation.name"] == "text_completion"
    assert attrs["gen_ai.provider.name"] == "strand"
    assert "error.type" not in attrs
    assert attrs["gen_ai.request.max_tokens"] == 4
    assert attrs["gen_ai.response.finish_reasons"] == ["length"]
    for name in ("gen_ai.latency.time_in_queue", "gen_ai.latency.time_to_first_token",
                 "gen_ai.latency.e2e"):
        assert 0.0 <= float(attrs[name]) < 30.0, name  # type: ignore[arg-type]
    ttft, e2e = attrs["gen_ai.latency.time_to_first_token"], attrs["gen_ai.latency.e2e"]
    assert float(ttft) <= float(e2e)  # type: ignore[arg-type]


def test_engine_step_span_reports_the_batch(auto_client: EngineClient,
                                            otlp_receiver: OtlpReceiver) -> None:
    auto_client.add_request("traced-3", {"prompt_token_ids": [1, 20, 21, 22, 23]},
                            SamplingParams(temperature=0.0, max_tokens=2))
    _finish(auto_client, "traced-3")
    steps = otlp_receiver.wait_for(
        lambda s: s.name == "engine_step" and s.attributes.get("strand.step.prefill_tokens") == 5)
    assert steps, "no engine_step span with the 5-token prefill"
    attrs = steps[0].attributes
    assert attrs["strand.step.batch_size"] == 1
    assert attrs["strand.step.scheduled_tokens"] == 5
    assert steps[0].service == "strand-engine"


def test_aborted_request_span_has_error_status_and_first_token_event(
        auto_client: EngineClient, otlp_receiver: OtlpReceiver) -> None:
    auto_client.add_request("traced-abort", {"prompt_token_ids": [1, 30, 31]},
                            SamplingParams(temperature=0.0, max_tokens=500, ignore_eos=True))
    deadline = time.monotonic() + 30
    while not any(o.request_id == "traced-abort" for o in auto_client.step()):
        assert time.monotonic() < deadline, "no output for traced-abort"
        time.sleep(0.05)
    auto_client.abort_request("traced-abort")
    span = _llm_request_span(otlp_receiver, "traced-abort")
    assert span.status_code == 2  # ERROR
    assert span.attributes["error.type"] == "CANCELLED"
    assert span.attributes["gen_ai.response.finish_reasons"] == ["abort"]
    assert "gen_ai.first_token" in span.events
