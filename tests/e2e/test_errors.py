"""Bad input: the right status code, a message naming the field, and no change of state."""

from __future__ import annotations

import grpc
import pytest

from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import gateway_pb2_grpc
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.client import EngineClient, RequestError
from tests.e2e.conftest import GATEWAY_MAX_MESSAGE_BYTES


def _add(stub: gateway_pb2_grpc.GatewayStub, request_id: str, params: pb.SamplingParams,
         prompt: pb.Prompt | None = None) -> None:
    stub.AddRequest(gpb.AddRequestRequest(request_id=request_id, params=params,
                                          prompt=prompt or pb.Prompt(text="hello")), timeout=30)


def _num_unfinished(stub: gateway_pb2_grpc.GatewayStub) -> int:
    return stub.GetNumUnfinishedRequests(gpb.GetNumUnfinishedRequestsRequest(), timeout=30).value


@pytest.mark.parametrize(("params", "field"), [
    (pb.SamplingParams(temperature=2.5), "temperature"),
    (pb.SamplingParams(top_p=0.0), "top_p"),
    (pb.SamplingParams(n=0), "n"),
    (pb.SamplingParams(max_tokens=0), "max_tokens"),
    (pb.SamplingParams(logprobs=50), "logprobs"),
])
def test_invalid_params_are_invalid_argument_naming_the_field(
        gateway_stub: gateway_pb2_grpc.GatewayStub, params: pb.SamplingParams,
        field: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _add(gateway_stub, "bad", params)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field)
    assert _num_unfinished(gateway_stub) == 0


def test_token_id_outside_vocab_is_refused_by_the_engine_and_nothing_stays(
        gateway_stub: gateway_pb2_grpc.GatewayStub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _add(gateway_stub, "vocab", pb.SamplingParams(stop_token_ids=[100000]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "stop_token_ids" in err.value.details()
    assert _num_unfinished(gateway_stub) == 0


def test_prompt_longer_than_max_model_len_is_invalid_argument(
        gateway_stub: gateway_pb2_grpc.GatewayStub) -> None:
    prompt = pb.Prompt(token_ids=pb.TokenIds(ids=[5] * 5000))
    with pytest.raises(grpc.RpcError) as err:
        _add(gateway_stub, "long", pb.SamplingParams(), prompt)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert _num_unfinished(gateway_stub) == 0


def test_empty_request_id_is_invalid_argument(gateway_stub: gateway_pb2_grpc.GatewayStub) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _add(gateway_stub, "", pb.SamplingParams())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request_id" in err.value.details()


def test_duplicate_request_id_is_already_exists(client: EngineClient) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=2)
    client.add_request("dup", "first", params)
    with pytest.raises(RequestError) as err:
        client.add_request("dup", "second", params)
    assert err.value.code == grpc.StatusCode.ALREADY_EXISTS
    assert client.get_num_unfinished_requests() == 1
    outputs = []
    while client.has_unfinished_requests():
        outputs += client.step()
    assert [o.prompt for o in outputs if o.finished] == ["first"]


def test_oversized_message_is_resource_exhausted_and_the_gateway_keeps_serving(
        gateway_stub: gateway_pb2_grpc.GatewayStub) -> None:
    huge = pb.Prompt(text="x" * (GATEWAY_MAX_MESSAGE_BYTES + 1024))
    with pytest.raises(grpc.RpcError) as err:
        _add(gateway_stub, "huge", pb.SamplingParams(), huge)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _num_unfinished(gateway_stub) == 0


def test_client_side_params_are_checked_before_sending(client: EngineClient) -> None:
    with pytest.raises(ValueError, match="top_k"):
        client.add_request("x", "hi", SamplingParams(top_k=-5))


@pytest.mark.parametrize(("request_id", "reason"), [
    ("bad\nid", "printable ASCII"),
    ("naïve", "printable ASCII"),
    ("x" * 257, "at most 256 characters"),
])
def test_a_request_id_that_is_not_valid_metadata_is_refused_before_anything_is_added(
        gateway_stub: gateway_pb2_grpc.GatewayStub, request_id: str, reason: str) -> None:
    stream = gateway_stub.Generate(gpb.GenerateRequest(
        request_id=request_id, prompt=pb.Prompt(text="hello"),
        params=pb.SamplingParams(max_tokens=3)), timeout=30)
    with pytest.raises(grpc.RpcError) as err:
        list(stream)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith("request_id must")
    assert reason in err.value.details()
    assert len(err.value.details()) < 200
    assert _num_unfinished(gateway_stub) == 0


@pytest.mark.parametrize(("params", "message"), [
    (pb.SamplingParams(n=129, temperature=1.0), "n must be <= 128"),
    (pb.SamplingParams(max_tokens=100_000), "max_tokens must be <= max_model_len"),
    (pb.SamplingParams(stop_token_ids=list(range(5000))), "stop_token_ids must be <= 1024"),
])
def test_oversized_asks_are_invalid_argument_with_short_messages(
        gateway_stub: gateway_pb2_grpc.GatewayStub, params: pb.SamplingParams,
        message: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        _add(gateway_stub, "too-big", params)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(message)
    assert _num_unfinished(gateway_stub) == 0
