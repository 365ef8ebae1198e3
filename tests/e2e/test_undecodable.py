"""Messages that do not decode are the caller's mistake: INVALID_ARGUMENT, one log line per
client per minute (not a traceback each), and the gateway keeps serving."""

from __future__ import annotations

import time

import grpc

from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import inference_pb2_grpc
from strand.services.launch import Stack

NUM_MESSAGES = 20
# Not a protobuf message: a field key with wire type 7, which does not exist.
GARBAGE = b"\xff" * 16
# A field-1 string (request_id) whose bytes are not UTF-8.
BAD_UTF8 = b"\x0a\x02\xc3\x28"


def test_undecodable_messages_are_invalid_argument_and_logged_once(stack: Stack) -> None:
    log = stack.config.log_dir / "gateway.log" if stack.config.log_dir else None
    assert log is not None
    codes: list[grpc.StatusCode] = []
    with grpc.insecure_channel(stack.gateway_address) as channel:
        add = channel.unary_unary("/strand.v1.Inference/AddRequest")
        generate = channel.unary_stream("/strand.v1.Inference/Generate")
        for i in range(NUM_MESSAGES):
            try:
                if i % 2:
                    add(BAD_UTF8 if i % 4 == 1 else GARBAGE, timeout=30)
                else:
                    list(generate(GARBAGE, timeout=30))
            except grpc.RpcError as exc:
                codes.append(exc.code())
                assert "does not decode" in exc.details()
        stub = inference_pb2_grpc.InferenceStub(channel)
        assert stub.GetNumUnfinishedRequests(gpb.GetNumUnfinishedRequestsRequest(),
                                             timeout=30).value == 0
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT] * NUM_MESSAGES
    time.sleep(0.2)  # the gateway's stderr reaches its log file
    text = log.read_text(errors="replace")
    assert text.count("undecodable /strand.v1.Inference/") == 1
    assert "Traceback" not in text
