"""A request's gRPC deadline travels with it to the engine, which drops the request itself once
the deadline has passed: no cancel, no Abort call needed."""

from __future__ import annotations

import time

import grpc

from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import gateway_pb2_grpc
from strand.services.client import EngineClient
from strand.services.common.convert import params_to_pb, prompt_to_pb
from strand.services.launch import Stack
from tests.e2e.conftest import engine_num_unfinished


def test_an_added_request_past_its_deadline_is_dropped_by_the_engine_alone(
        stack: Stack, client: EngineClient) -> None:
    # AddRequest returns once the request is in: nothing cancels it after that, so only the
    # deadline that travelled with it can end it.
    with grpc.insecure_channel(stack.gateway_address) as channel:
        gateway_pb2_grpc.GatewayStub(channel).AddRequest(gpb.AddRequestRequest(
            request_id="short-lived", prompt=prompt_to_pb("a request nobody waits for"),
            params=params_to_pb(SamplingParams(max_tokens=100, ignore_eos=True))),
            timeout=1.0, metadata=client._metadata())
    outputs = client.step()
    assert engine_num_unfinished(stack) == 1  # running until its deadline
    time.sleep(1.1)
    for _ in range(5):
        outputs += client.step()
        if any(o.finished for o in outputs):
            break
    final = [o for o in outputs if o.finished and isinstance(o, RequestOutput)]
    assert [(o.request_id, o.outputs[0].finish_reason) for o in final] == [
        ("short-lived", "abort")]
    assert engine_num_unfinished(stack) == 0
    assert client.reset_prefix_cache(reset_running_requests=False)
