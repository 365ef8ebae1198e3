"""Over the real gateway: requests belong to the client that added them (Step, Abort and
duplicate ids see only the caller's own), and a Step answer larger than the caller reads is
paged, nothing lost."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import inference_pb2_grpc
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.gateway.clients import CLIENT_METADATA
from strand.services.launch import Stack
from tests.e2e.conftest import engine_num_unfinished

# A connection of its own (gRPC shares one between equal channels of a process by default).
_OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


@pytest.fixture
def two_stubs(stack: Stack) -> Iterator[tuple[inference_pb2_grpc.InferenceStub,
                                              inference_pb2_grpc.InferenceStub]]:
    with grpc.insecure_channel(stack.gateway_address, options=_OWN_CONNECTION) as a, \
            grpc.insecure_channel(stack.gateway_address, options=_OWN_CONNECTION) as b:
        yield inference_pb2_grpc.InferenceStub(a), inference_pb2_grpc.InferenceStub(b)


def _add(stub: inference_pb2_grpc.InferenceStub, request_id: str, max_tokens: int = 3,
         prompt_logprobs: int | None = None) -> None:
    params = pb.SamplingParams(temperature=0.0, max_tokens=max_tokens)
    if prompt_logprobs is not None:
        params.prompt_logprobs = prompt_logprobs
    stub.AddRequest(gpb.AddRequestRequest(
        request_id=request_id, prompt=pb.Prompt(text="isolation test prompt"), params=params),
        timeout=30)


def _run_to_end(stub: inference_pb2_grpc.InferenceStub, max_response_bytes: int | None = None
                ) -> list[pb.RequestOutput]:
    outputs: list[pb.RequestOutput] = []
    for _ in range(100):
        step = stub.Step(gpb.StepRequest(max_response_bytes=max_response_bytes), timeout=30)
        outputs += step.outputs
        if (step.num_pending == 0 and stub.GetNumUnfinishedRequests(
                gpb.GetNumUnfinishedRequestsRequest(), timeout=30).value == 0):
            return outputs
    raise AssertionError("the requests did not finish in 100 steps")


def test_each_connection_sees_only_its_own_requests(stack: Stack, two_stubs: tuple[
        inference_pb2_grpc.InferenceStub, inference_pb2_grpc.InferenceStub]) -> None:
    alice, bob = two_stubs
    _add(alice, "same-id")
    _add(bob, "same-id", max_tokens=5)  # another client's id: no ALREADY_EXISTS, nothing shown
    with pytest.raises(grpc.RpcError) as dup:
        _add(bob, "same-id")
    assert dup.value.code() == grpc.StatusCode.ALREADY_EXISTS
    with pytest.raises(grpc.RpcError) as other:
        bob.Abort(gpb.AbortRequest(request_ids=["alice-only"]), timeout=30)
    assert other.value.code() == grpc.StatusCode.NOT_FOUND
    _add(alice, "alice-only")
    with pytest.raises(grpc.RpcError) as not_bobs:
        bob.Abort(gpb.AbortRequest(request_ids=["alice-only"]), timeout=30)
    assert not_bobs.value.code() == grpc.StatusCode.NOT_FOUND
    bob_outputs = _run_to_end(bob)
    alice_outputs = _run_to_end(alice)
    # Each got the whole of its own requests and nothing of the other's.
    assert {o.request_id for o in bob_outputs} == {"same-id"}
    assert bob_outputs[-1].finished and len(bob_outputs[-1].outputs[0].token_ids) == 5
    assert {o.request_id for o in alice_outputs} == {"same-id", "alice-only"}
    finals = [o for o in alice_outputs if o.finished]
    assert sorted(o.request_id for o in finals) == ["alice-only", "same-id"]
    assert engine_num_unfinished(stack) == 0


def test_a_label_is_one_client_across_connections(stack: Stack, two_stubs: tuple[
        inference_pb2_grpc.InferenceStub, inference_pb2_grpc.InferenceStub]) -> None:
    """The OpenAI front's case: its Abort comes on a fresh connection, with the same label."""
    first, second = two_stubs
    label = ((CLIENT_METADATA, "front-under-test"),)
    first.AddRequest(gpb.AddRequestRequest(
        request_id="labelled", prompt=pb.Prompt(text="abc"),
        params=pb.SamplingParams(max_tokens=50)), metadata=label, timeout=30)
    second.Abort(gpb.AbortRequest(request_ids=["labelled"]), metadata=label, timeout=30)
    assert first.GetNumUnfinishedRequests(gpb.GetNumUnfinishedRequestsRequest(), metadata=label,
                                          timeout=30).value == 0
    assert engine_num_unfinished(stack) == 0


def test_a_step_larger_than_the_caller_reads_is_paged(stack: Stack, two_stubs: tuple[
        inference_pb2_grpc.InferenceStub, inference_pb2_grpc.InferenceStub]) -> None:
    stub = two_stubs[0]
    limit = 4096
    for i in range(6):  # each first output carries 8 logprobs per prompt token: > 1 KiB
        _add(stub, f"paged-{i}", max_tokens=4, prompt_logprobs=8)
    outputs = _run_to_end(stub, max_response_bytes=limit)
    # More than one answer's worth, and none of the outputs alone too large for one.
    assert sum(o.ByteSize() for o in outputs) > 2 * limit
    for i in range(6):
        mine = [o for o in outputs if o.request_id == f"paged-{i}"]
        assert [len(o.outputs[0].token_ids) for o in mine] == [1, 2, 3, 4], [  # cumulative
            (o.ByteSize(), o.error) for o in mine]
        assert mine[-1].finished and mine[-1].outputs[0].finish_reason == "length"
        assert any(len(o.prompt_logprobs.positions) > 0 for o in mine)
    assert engine_num_unfinished(stack) == 0
