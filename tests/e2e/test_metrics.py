"""/metrics of every service over HTTP, read with Prometheus' own text parser: the families are
there with their types, and they move with requests (counters grow, histograms count)."""

from __future__ import annotations

import grpc
import pytest

from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import gateway_pb2_grpc
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.client import EngineClient
from strand.services.launch import METRICS_ORDER, Stack
from tests.e2e.metrics_scrape import MAX_TOKENS, PROMPTS, run_requests, scrape, value


def test_every_service_serves_its_families(stack: Stack) -> None:
    expected = {
        "engine": {"strand:num_requests_running": "gauge", "strand:num_requests_waiting": "gauge",
                   "strand:kv_cache_usage_perc": "gauge", "strand:prompt_tokens": "counter",
                   "strand:generation_tokens": "counter", "strand:num_preemptions": "counter",
                   "strand:prefix_cache_queries": "counter", "strand:prefix_cache_hits": "counter",
                   "strand:iteration_tokens_total": "histogram",
                   "strand:cache_config_info": "gauge"},
        "detokenizer": {"strand:time_to_first_token_seconds": "histogram",
                        "strand:inter_token_latency_seconds": "histogram",
                        "strand:e2e_request_latency_seconds": "histogram",
                        "strand:request_queue_time_seconds": "histogram",
                        "strand:request_prefill_time_seconds": "histogram",
                        "strand:request_decode_time_seconds": "histogram",
                        "strand:request_success": "counter"},
        "tokenizer": {"strand:tokenize_time_seconds": "histogram",
                      "strand:tokenizer_requests": "counter"},
        "gateway": {"strand:gateway_num_requests_live": "gauge",
                    "strand:gateway_request_finished": "counter",
                    "strand:gateway_e2e_request_latency_seconds": "histogram"},
    }
    assert set(stack.metrics_ports) == set(METRICS_ORDER)
    for service, families in expected.items():
        types, samples = scrape(stack, service)
        for name, kind in families.items():
            assert types.get(name) == kind, (service, name, types.get(name))
        assert value(samples, "process_cpu_seconds_total") > 0  # the process's own metrics


def test_metrics_move_with_requests(stack: Stack, client: EngineClient) -> None:
    before = {s: scrape(stack, s)[1] for s in METRICS_ORDER}
    run_requests(client, "metrics")
    after = {s: scrape(stack, s)[1] for s in METRICS_ORDER}

    def delta(service: str, name: str, **labels: str) -> float:
        return value(after[service], name, labels) - value(before[service], name, labels)

    num = len(PROMPTS)
    assert delta("engine", "strand:prompt_tokens_total") == sum(len(p) for p in PROMPTS)
    assert delta("engine", "strand:generation_tokens_total") == num * MAX_TOKENS
    assert delta("engine", "strand:prefix_cache_queries_total") == sum(len(p) for p in PROMPTS)
    assert delta("engine", "strand:iteration_tokens_total_count") >= MAX_TOKENS
    assert value(after["engine"], "strand:num_requests_running") == 0
    assert delta("detokenizer", "strand:request_success_total", finished_reason="length") == num
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds",
                 "request_queue_time_seconds", "request_prefill_time_seconds",
                 "request_decode_time_seconds"):
        assert delta("detokenizer", f"strand:{name}_count") == num, name
        assert delta("detokenizer", f"strand:{name}_bucket", le="+Inf") == num, name
    assert delta("detokenizer", "strand:inter_token_latency_seconds_count") == \
        num * (MAX_TOKENS - 1)
    assert delta("tokenizer", "strand:tokenizer_requests_total", outcome="added") == num
    assert delta("tokenizer", "strand:tokenize_time_seconds_count") == num
    assert delta("gateway", "strand:gateway_requests_total", outcome="added") == num
    assert delta("gateway", "strand:gateway_request_finished_total",
                 finished_reason="length") == num
    assert delta("gateway", "strand:gateway_e2e_request_latency_seconds_count") == num
    assert value(after["gateway"], "strand:gateway_num_requests_live") == 0


def test_refused_and_aborted_requests_are_counted(
        stack: Stack, client: EngineClient, gateway_stub: gateway_pb2_grpc.GatewayStub) -> None:
    before = {s: scrape(stack, s)[1] for s in ("gateway", "tokenizer", "detokenizer")}
    with pytest.raises(grpc.RpcError) as refused:  # the tokenizer stage validates max_tokens
        gateway_stub.AddRequest(gpb.AddRequestRequest(
            request_id="metrics-bad", prompt=pb.Prompt(text="hi"),
            params=pb.SamplingParams(max_tokens=0)), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    client.add_request("metrics-abort", "hi", SamplingParams(max_tokens=50, ignore_eos=True))
    client.step()
    client.abort_request("metrics-abort")
    after = {s: scrape(stack, s)[1] for s in before}
    for service, name, labels in (
            ("gateway", "strand:gateway_requests_total", {"outcome": "INVALID_ARGUMENT"}),
            ("tokenizer", "strand:tokenizer_requests_total", {"outcome": "INVALID_ARGUMENT"}),
            ("gateway", "strand:gateway_request_finished_total", {"finished_reason": "abort"}),
            ("detokenizer", "strand:request_success_total", {"finished_reason": "abort"})):
        grew = value(after[service], name, labels) - value(before[service], name, labels,
                                                           missing=0.0)
        assert grew == 1, (service, name, labels)
