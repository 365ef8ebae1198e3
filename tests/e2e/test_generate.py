"""Generate streams a request's outputs (manual mode: Step drives it); cancelling aborts it."""

from __future__ import annotations

import time

from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import gateway_pb2_grpc
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.client import EngineClient
from strand.services.launch import Stack
from tests.e2e.conftest import engine_num_unfinished


def test_generate_yields_the_same_tokens_as_add_and_step(client: EngineClient) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=6)
    client.add_request("ref", "The quick brown fox", params)
    reference = None
    while client.has_unfinished_requests():
        for out in client.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            reference = out
    streamed = list(client.generate("The quick brown fox", params, request_id="gen-1"))
    assert reference is not None
    assert [o.finished for o in streamed] == [False] * 5 + [True]
    assert streamed[-1].outputs[0].token_ids == reference.outputs[0].token_ids
    assert streamed[-1].outputs[0].text == reference.outputs[0].text


def test_generate_delta_outputs_add_up_to_the_whole(client: EngineClient) -> None:
    whole = list(client.generate("delta test", SamplingParams(temperature=0.0, max_tokens=5)))
    delta_params = SamplingParams(temperature=0.0, max_tokens=5,
                                  output_kind=RequestOutputKind.DELTA)
    deltas = list(client.generate("delta test", delta_params))
    assert sum((d.outputs[0].token_ids for d in deltas), []) == whole[-1].outputs[0].token_ids
    assert "".join(d.outputs[0].text for d in deltas) == whole[-1].outputs[0].text


def test_generate_outputs_do_not_appear_in_step(client: EngineClient,
                                                gateway_stub: gateway_pb2_grpc.GatewayStub
                                                ) -> None:
    call = gateway_stub.Generate(gpb.GenerateRequest(
        request_id="streamed", prompt=pb.Prompt(text="abc"),
        params=pb.SamplingParams(temperature=0.0, max_tokens=1)), timeout=30)
    call.initial_metadata()
    step = gateway_stub.Step(gpb.StepRequest(), timeout=30)
    assert list(step.outputs) == []
    assert list(step.streamed_request_ids) == ["streamed"]
    assert [o.finished for o in call] == [True]


def test_cancelled_generate_aborts_in_engine_and_detokenizer(
        stack: Stack, gateway_stub: gateway_pb2_grpc.GatewayStub) -> None:
    call = gateway_stub.Generate(gpb.GenerateRequest(
        request_id="cancel-me", prompt=pb.Prompt(text="long one"),
        params=pb.SamplingParams(temperature=0.0, max_tokens=500)), timeout=60)
    call.initial_metadata()
    gateway_stub.Step(gpb.StepRequest(), timeout=30)
    first = next(call)
    assert first.request_id == "cancel-me" and not first.finished
    call.cancel()
    deadline = time.monotonic() + 10
    num = None
    while time.monotonic() < deadline:
        num = gateway_stub.GetNumUnfinishedRequests(gpb.GetNumUnfinishedRequestsRequest()).value
        if num == 0:
            break
        time.sleep(0.05)
    assert num == 0
    assert engine_num_unfinished(stack) == 0


def test_closing_the_client_iterator_aborts_the_request(client: EngineClient,
                                                        stack: Stack) -> None:
    outputs = client.generate("stop early", SamplingParams(temperature=0.0, max_tokens=500))
    first = next(outputs)
    assert not first.finished
    outputs.close()
    deadline = time.monotonic() + 10
    while client.get_num_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.get_num_unfinished_requests() == 0
    assert engine_num_unfinished(stack) == 0


def test_server_info_describes_the_model(client: EngineClient, stack: Stack) -> None:
    info = client.get_server_info()
    assert info["model"] == stack.config.model
    assert info["max_model_len"] == 2048
    assert info["block_size"] == 16
    assert info["num_blocks"] > 0
    assert info["vocab_size"] == 512
    assert info["auto_step"] is False
    assert (info["dtype"], info["kv_cache_dtype"]) == ("float32", "float32")
    assert {"python", "grpc", "protobuf", "torch"} <= set(info["versions"])


def test_outputs_name_the_prompt_as_in_process(client: EngineClient) -> None:
    # LLMEngine gives RequestOutput.prompt: the text, the text given with token ids, or None.
    params = SamplingParams(max_tokens=1, output_kind=RequestOutputKind.FINAL_ONLY)
    ids = client.tokenize("kalo mi")["tokens"]
    for prompt, expected in (("kalo mi", "kalo mi"),
                             ({"prompt_token_ids": ids, "prompt": "kalo mi"}, "kalo mi"),
                             ({"prompt_token_ids": ids}, None)):
        final = list(client.generate(prompt, params))[-1]
        assert final.prompt == expected, prompt
