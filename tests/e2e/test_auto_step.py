"""Auto mode: the engine steps while it has work; Step returns what was produced since the last."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strand.engine_core.config import EngineArgs
from strand.engine_core.llm_engine import LLMEngine
from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import SamplingParams
from strand.services.client import EngineClient
from strand.services.launch import Stack


def _collect_until_finished(client: EngineClient, request_id: str,
                            timeout: float = 30) -> list[RequestOutput]:
    outputs: list[RequestOutput] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        outputs += [o for o in client.step()
                    if isinstance(o, RequestOutput) and o.request_id == request_id]
        if outputs and outputs[-1].finished:
            return outputs
        time.sleep(0.05)
    raise AssertionError(f"{request_id} did not finish in {timeout}s")


def test_requests_finish_without_anyone_calling_step(auto_client: EngineClient) -> None:
    auto_client.add_request("auto-1", "run by itself", SamplingParams(temperature=0.0,
                                                                      max_tokens=4))
    deadline = time.monotonic() + 30
    while auto_client.has_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not auto_client.has_unfinished_requests()
    outputs = auto_client.step()  # everything produced since the last Step, kept for us
    finals = [o for o in outputs
              if isinstance(o, RequestOutput) and o.request_id == "auto-1" and o.finished]
    assert len(finals) == 1
    assert len(finals[0].outputs[0].token_ids) == 4


def test_step_after_collecting_returns_nothing_new(auto_client: EngineClient) -> None:
    auto_client.add_request("auto-2", "again", SamplingParams(temperature=0.0, max_tokens=3))
    outputs = _collect_until_finished(auto_client, "auto-2")
    assert outputs[-1].outputs[0].finish_reason == "length"
    assert auto_client.step() == []


def test_generate_streams_without_step_calls(auto_client: EngineClient) -> None:
    outputs = list(auto_client.generate("stream me", SamplingParams(temperature=0.0,
                                                                    max_tokens=5)))
    assert outputs[-1].finished
    assert len(outputs[-1].outputs[0].token_ids) == 5
    assert auto_client.step() == []


def test_calls_without_the_api_key_are_unauthenticated(auto_stack: Stack) -> None:
    with EngineClient(auto_stack.gateway_address) as anonymous:
        with pytest.raises(grpc.RpcError) as err:
            anonymous.get_num_unfinished_requests()
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_health_needs_no_api_key(auto_stack: Stack) -> None:
    with grpc.insecure_channel(auto_stack.gateway_address) as channel:
        resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                         timeout=10)
    assert resp.status == health_pb2.HealthCheckResponse.SERVING


def test_stop_string_ends_a_request_as_in_process_though_steps_run_ahead(
        auto_client: EngineClient, tiny_model_dir: Path) -> None:
    # The gateway keeps engine steps queued ahead of the detokenizer, so the engine computes a
    # token or two past the stop string; none of them may reach the output.
    import torch

    torch.set_num_threads(1)
    local = LLMEngine.from_engine_args(EngineArgs(model=str(tiny_model_dir),
                                                  kv_cache_memory=16 * 1024**2))
    free = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    text = _run_local(local, "stop-probe", free).outputs[0].text
    assert len(text) >= 6
    stop = text[len(text) // 2:len(text) // 2 + 2]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, stop=[stop])
    expected = _run_local(local, "stop-local", params).outputs[0]
    got = list(auto_client.generate("stop early", params))[-1].outputs[0]
    assert (got.text, got.token_ids, got.finish_reason, got.stop_reason) == (
        expected.text, expected.token_ids, "stop", stop)
    assert len(got.token_ids) < 16
    assert not auto_client.has_unfinished_requests()


def _run_local(engine: LLMEngine, request_id: str, params: SamplingParams) -> RequestOutput:
    engine.add_request(request_id, "stop early", params)
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            final = out
    assert final is not None and final.finished
    return final
