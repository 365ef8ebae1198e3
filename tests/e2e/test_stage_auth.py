"""The internal stages are inside the security boundary: without the stack's stage token a
caller is UNAUTHENTICATED (health stays open), and a stage refuses to listen beyond loopback
unauthenticated."""

from __future__ import annotations

import os
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strand.services._proto.strand.v1 import detokenizer_pb2 as dpb
from strand.services._proto.strand.v1 import detokenizer_pb2_grpc, engine_pb2_grpc
from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services.common.stage_auth import STAGE_TOKEN_ENV
from strand.services.common.stage_protocol import PROTOCOL, PROTOCOL_HEADER
from strand.services.launch import REPO_ROOT, Stack


def test_stages_refuse_callers_without_the_stage_token(stack: Stack) -> None:
    with grpc.insecure_channel(stack.address("engine")) as channel:
        responses = engine_pb2_grpc.EngineStub(channel).Session(
            iter([epb.EngineRequest(seq=1, query=epb.EngineQuery())]), timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            next(iter(responses))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Nobody but the detokenizer may read the engine's outputs (other clients' tokens).
        outputs = engine_pb2_grpc.EngineStub(channel).Outputs(epb.EngineOutputsRequest(),
                                                               timeout=30)
        with pytest.raises(grpc.RpcError) as err:
            next(iter(outputs))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="readiness"), timeout=30)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(stack.address("detokenizer")) as channel:
        wrong = (("authorization", "Bearer not-the-token"),)
        stream = detokenizer_pb2_grpc.DetokenizerStub(channel).Outputs(
            dpb.DetokOutputsRequest(origin="intruder"), timeout=30, metadata=wrong)
        with pytest.raises(grpc.RpcError) as err:
            next(iter(stream))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_stage_refuses_a_caller_of_another_version_by_name(stack: Stack) -> None:
    token = (("authorization", f"Bearer {stack.stage_token}"),)
    with grpc.insecure_channel(stack.address("engine")) as channel:
        session = engine_pb2_grpc.EngineStub(channel).Session
        other = session(iter([epb.EngineRequest(seq=1, query=epb.EngineQuery())]), timeout=30,
                        metadata=(*token, (PROTOCOL_HEADER, "0123456789abcdef")))
        with pytest.raises(grpc.RpcError) as err:
            next(iter(other))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert f"engine speaks stage protocol {PROTOCOL}" in (err.value.details() or "")
        # A caller that says no protocol (grpcurl with the token) is served.
        said_none = session(iter([epb.EngineRequest(seq=2, query=epb.EngineQuery())]),
                            timeout=30, metadata=token)
        assert next(iter(said_none)).seq == 2


def test_a_stage_on_all_interfaces_without_a_token_refuses_to_start(tiny_model_dir: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != STAGE_TOKEN_ENV}
    env["PYTHONPATH"] = str(REPO_ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "strand.services.detokenizer", "--model", str(tiny_model_dir),
         "--host", "0.0.0.0", "--port", "0"], env=env, capture_output=True, text=True,
        timeout=120)
    assert result.returncode == 1
    assert "would expose an internal stage to the network unauthenticated" in result.stderr
    assert STAGE_TOKEN_ENV in result.stderr
