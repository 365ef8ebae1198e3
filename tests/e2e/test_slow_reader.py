"""A Generate client that stops reading: its outputs wait at the gateway merged into one (DELTA
appended), not as a backlog, and reach it whole when it reads again (strand/services/gateway/
stream_outputs.py), over a real stack and a real gRPC flow-control window."""

from __future__ import annotations

import time

import grpc

from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import inference_pb2_grpc
from strand.services.client import EngineClient, auth_metadata
from strand.services.common.convert_params import params_to_pb, prompt_to_pb
from strand.services.launch import Stack
from tests.e2e.conftest import API_KEY, engine_num_unfinished

PROMPT = [1, 17, 33, 5]
MAX_TOKENS = 1500
LOGPROBS = 20  # ~0.5 KB a DELTA message, ~0.7 MB in all: more than gRPC buffers on the way


def test_a_client_that_stops_reading_gets_the_rest_merged_and_whole(auto_stack: Stack) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True,
                            logprobs=LOGPROBS, output_kind=RequestOutputKind.FINAL_ONLY)
    with EngineClient(auto_stack.gateway_address, api_key=API_KEY, timeout=60) as client:
        *_, expected = client.generate({"prompt_token_ids": PROMPT}, params)
    # No BDP probing: the window stays at gRPC's 64 KiB, so the gateway's writes block.
    with grpc.insecure_channel(auto_stack.gateway_address,
                               options=[("grpc.http2.bdp_probe", 0)]) as channel:
        stream = inference_pb2_grpc.InferenceStub(channel).Generate(
            gpb.GenerateRequest(
                request_id="slow-reader", prompt=prompt_to_pb({"prompt_token_ids": PROMPT}),
                params=params_to_pb(SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS,
                                                   ignore_eos=True, logprobs=LOGPROBS,
                                                   output_kind=RequestOutputKind.DELTA))),
            metadata=auth_metadata(API_KEY, None), timeout=120)
        first = next(stream)
        deadline = time.monotonic() + 60
        while engine_num_unfinished(auto_stack) and time.monotonic() < deadline:
            time.sleep(0.05)  # not reading: the request runs to its end meanwhile
        rest = list(stream)
    outputs = [first, *rest]
    tokens = [t for o in outputs for t in o.outputs[0].token_ids]
    assert tokens == expected.outputs[0].token_ids
    assert "".join(o.outputs[0].text for o in outputs) == expected.outputs[0].text
    merged_logprobs = [p for o in outputs for p in o.outputs[0].logprobs.positions]
    assert len(merged_logprobs) == MAX_TOKENS  # every position's logprobs, none lost
    assert outputs[-1].finished and outputs[-1].outputs[0].finish_reason == "length"
    assert len(outputs) < MAX_TOKENS // 2  # what waited came merged, not one message a token

