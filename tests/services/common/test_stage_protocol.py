"""Stages of two Strand versions refuse each other by name (strand/services/common/stage_protocol.py):
over gRPC and over the local link, a caller that speaks another stage protocol is answered
FAILED_PRECONDITION naming both; Strand's own callers speak this one; a caller that says none
(grpcurl) is served."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import grpc
import pytest

from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import engine_pb2_grpc
from strand.services.common import link_call, stage_auth
from strand.services.common.link_server import LinkRegistry, LinkServer
from strand.services.common.server import ProtocolInterceptor
from strand.services.common.stage_client import StageClient
from strand.services.common.stage_link import TRANSPORT_ENV, TRANSPORTS
from strand.services.common.stage_protocol import PROTOCOL, PROTOCOL_HEADER
from strand.services.common.status import StageError
from strand.services.launch import REPO_ROOT

OTHER = "0123456789abcdef"  # what a stage of another version would say


class AnsweringEngine(engine_pb2_grpc.EngineServicer):
    async def Session(self, request_iterator: AsyncIterator[epb.EngineRequest],
                      context: grpc.aio.ServicerContext) -> AsyncIterator[epb.EngineResponse]:
        async for msg in request_iterator:
            yield epb.EngineResponse(seq=msg.seq)


async def _serve() -> tuple[grpc.aio.Server, LinkServer, str]:
    server = grpc.aio.server(interceptors=[ProtocolInterceptor("engine")])
    registry = LinkRegistry(server)
    engine_pb2_grpc.add_EngineServicer_to_server(AnsweringEngine(), registry)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    link = LinkServer("engine", registry.handlers, None, 1 << 20)
    await link.start(port)
    return server, link, f"127.0.0.1:{port}"


async def _query() -> int:
    server, link, address = await _serve()
    client = StageClient("engine", address, engine_pb2_grpc.EngineStub)
    try:
        return (await client.call(epb.EngineRequest(query=epb.EngineQuery()))).seq
    finally:
        await client.close()
        await link.close()
        await server.stop(None)


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(TRANSPORT_ENV, request.param)
    monkeypatch.delenv("STRAND_STAGE_TOKEN", raising=False)
    return str(request.param)


def test_strand_s_own_stage_callers_are_served(transport: str) -> None:
    assert asyncio.run(_query()) == 1


def test_a_caller_of_another_version_is_refused_naming_both_protocols(
        transport: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The caller's side of another version: its gRPC metadata and its link HELLO.
    monkeypatch.setattr(stage_auth, "PROTOCOL", OTHER)
    monkeypatch.setattr(link_call, "PROTOCOL", OTHER)
    with pytest.raises(StageError) as err:
        asyncio.run(_query())
    # The session could not open: the caller reports the stage unavailable, saying why.
    assert (f"FAILED_PRECONDITION: engine speaks stage protocol {PROTOCOL}, the caller {OTHER}"
            in err.value.message)
    assert "run every stage at one version" in err.value.message


def test_a_caller_that_says_no_protocol_is_served() -> None:
    async def body() -> None:
        server, link, address = await _serve()
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                stub = engine_pb2_grpc.EngineStub(channel)
                call = stub.Session(iter([epb.EngineRequest(seq=7)]))
                assert [r.seq async for r in call] == [7]
                call = stub.Session(iter([epb.EngineRequest(seq=8)]),
                                    metadata=((PROTOCOL_HEADER, OTHER),))
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    [r async for r in call]
                assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        finally:
            await link.close()
            await server.stop(None)
    asyncio.run(body())


def test_the_protocol_is_a_fingerprint_every_process_computes_alike() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    other = subprocess.run(
        [sys.executable, "-c", "from strand.services.common.stage_protocol import PROTOCOL; "
                               "print(PROTOCOL)"],
        env=env, capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert other == PROTOCOL
    assert len(PROTOCOL) == 16 and int(PROTOCOL, 16) >= 0
