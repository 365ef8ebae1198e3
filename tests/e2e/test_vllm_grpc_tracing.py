"""A request through the VllmEngine front (the protocol smg speaks) is one trace from the caller
through the front and every stage, and the gateway's Prometheus metrics count it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strand.services.launch import Stack, StackConfig, launch_stack
from tests.e2e.conftest import ENGINE_FLAGS
from tests.e2e.metrics_scrape import scrape, value
from tests.e2e.otlp_receiver import OtlpReceiver

pytest.importorskip("smg_grpc_proto", reason="smg-grpc-proto (a dependency) is not installed")
from smg_grpc_proto.generated import vllm_engine_pb2 as vpb  # noqa: E402
from smg_grpc_proto.generated import vllm_engine_pb2_grpc  # noqa: E402

# The caller's W3C context (what smg sends when it traces): the front's span continues it.
CALLER_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN_ID = "00f067aa0ba902b7"
STAGES = {"strand-gateway", "strand-tokenizer", "strand-engine", "strand-detokenizer"}


@pytest.fixture(scope="module")
def traced_vllm_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                      otlp_receiver: OtlpReceiver) -> Iterator[Stack]:
    config = StackConfig(model=str(tiny_model_dir), engine_args=list(ENGINE_FLAGS),
                         gateway_args=["--auto-step"],
                         log_dir=tmp_path_factory.mktemp("vllm-grpc-traced-logs"),
                         otlp_traces_endpoint=otlp_receiver.endpoint, metrics_port=0,
                         vllm_grpc_port=0)
    with launch_stack(config, timeout=180) as stack:
        yield stack


def _generate(stack: Stack, request_id: str, max_tokens: int,
              metadata: tuple[tuple[str, str], ...] = ()) -> list[vpb.GenerateResponse]:
    request = vpb.GenerateRequest(
        request_id=request_id, tokenized=vpb.TokenizedInput(input_ids=[1, 40, 41, 42]),
        sampling_params=vpb.SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                           ignore_eos=True))
    with grpc.insecure_channel(stack.address("vllm_grpc")) as channel:
        return list(vllm_engine_pb2_grpc.VllmEngineStub(channel).Generate(
            request, metadata=metadata, timeout=60))


def test_a_generate_call_is_one_trace_through_the_front_and_every_stage(
        traced_vllm_stack: Stack, otlp_receiver: OtlpReceiver) -> None:
    traceparent = f"00-{CALLER_TRACE_ID}-{CALLER_SPAN_ID}-01"
    responses = _generate(traced_vllm_stack, "vllm-traced-1", 3, (("traceparent", traceparent),))
    assert len(responses[-1].complete.output_ids) == 3
    fronts = otlp_receiver.wait_for(
        lambda s: s.name == "vllm.grpc.engine.VllmEngine/Generate"
        and s.attributes.get("gen_ai.request.id") == "vllm-traced-1")
    assert len(fronts) == 1
    front = fronts[0]
    assert (front.service, front.trace_id, front.parent_span_id) == \
        ("strand-vllm-grpc", CALLER_TRACE_ID, CALLER_SPAN_ID)
    time.sleep(1.5)  # the stages' batch exporters flush within half a second
    spans = otlp_receiver.trace(CALLER_TRACE_ID)
    assert {s.service for s in spans} == {"strand-vllm-grpc", *STAGES}
    gateway = [s for s in spans if s.name == "strand.v1.Inference/Generate"]
    assert [s.parent_span_id for s in gateway] == [front.span_id]
    llm = [s for s in spans if s.name == "llm_request"]
    assert [s.attributes.get("gen_ai.request.id") for s in llm] == ["vllm-traced-1"]
    assert llm[0].attributes["gen_ai.usage.completion_tokens"] == 3


def test_the_gateway_metrics_count_a_generate_call(traced_vllm_stack: Stack) -> None:
    before = scrape(traced_vllm_stack, "gateway")[1]
    _generate(traced_vllm_stack, "vllm-metered-1", 2)
    after = scrape(traced_vllm_stack, "gateway")[1]

    def grew(name: str, **labels: str) -> float:
        return value(after, name, labels) - value(before, name, labels, missing=0.0)

    assert grew("strand:gateway_requests_total", outcome="added") == 1
    assert grew("strand:gateway_request_finished_total", finished_reason="length") == 1
    assert grew("strand:gateway_e2e_request_latency_seconds_count") == 1
    assert value(after, "strand:gateway_num_requests_live") == 0
