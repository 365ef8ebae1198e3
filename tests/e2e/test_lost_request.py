"""A request removed from the engine behind the gateway's back (aborted at the engine directly)
ends its client's stream with finish_reason "error" in bounded time, instead of leaving it
waiting forever, and leaves nothing in the engine."""

from __future__ import annotations

import grpc

from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import engine_pb2_grpc, inference_pb2_grpc
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.gateway.clients import CLIENT_METADATA, internal_id
from strand.services.launch import Stack
from tests.e2e.conftest import API_KEY, engine_num_unfinished

LABEL = "lost-request-test"


def _abort_at_the_engine(stack: Stack, request_id: str) -> None:
    with grpc.insecure_channel(stack.address("engine")) as channel:
        responses = engine_pb2_grpc.EngineStub(channel).Session(
            iter([epb.EngineRequest(seq=1, abort=epb.EngineAbort(request_ids=[request_id]))]),
            timeout=30, metadata=(("authorization", f"Bearer {stack.stage_token}"),))
        assert next(iter(responses)).WhichOneof("kind") == "state"


def test_a_request_aborted_behind_the_gateways_back_ends_with_error(auto_stack: Stack) -> None:
    metadata = (("authorization", f"Bearer {API_KEY}"), (CLIENT_METADATA, LABEL))
    with grpc.insecure_channel(auto_stack.gateway_address) as channel:
        # The reconcile check runs every 5 s and needs two misses: well within the deadline,
        # which bounds the test if the stream were left waiting.
        call = inference_pb2_grpc.InferenceStub(channel).Generate(gpb.GenerateRequest(
            request_id="lost-1", prompt=pb.Prompt(text="lost in the engine"),
            params=pb.SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True)),
            metadata=metadata, timeout=60)
        outputs = iter(call)
        assert not next(outputs).finished
        _abort_at_the_engine(auto_stack, internal_id(f"key/{LABEL}", "lost-1"))
        rest = list(outputs)
    assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "error"
    assert "no longer holds" in rest[-1].error
    assert engine_num_unfinished(auto_stack) == 0
