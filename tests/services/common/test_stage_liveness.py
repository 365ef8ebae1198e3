"""A stage call never waits forever: a frozen stage (SIGSTOP) turns into UNAVAILABLE within a few
seconds (keepalive pings go unanswered), and a stage that is up but never answers into
DEADLINE_EXCEEDED at the call's deadline, while its pings keep the connection up."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strand.services._proto.strand.v1 import engine_pb2 as epb
from strand.services._proto.strand.v1 import engine_pb2_grpc
from strand.services.common.link_call import LinkCall
from strand.services.common.stage_client import StageClient
from strand.services.common.stage_link import TRANSPORT_ENV, TRANSPORTS
from strand.services.common.status import StageError

REPO_ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def silent_stage() -> Iterator[tuple[subprocess.Popen[str], str]]:
    process = subprocess.Popen([sys.executable, "-m", "tests.services.common.silent_stage"],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # "strand engine listening on 127.0.0.1:PORT"
        assert "listening on" in line, line
        yield process, line.split()[-1]
    finally:
        process.send_signal(signal.SIGCONT)
        process.kill()
        process.wait(10)


async def _query(address: str, call_timeout: float, freeze: subprocess.Popen[str] | None,
                 transport: str) -> StageError:
    client = StageClient("engine", address, engine_pb2_grpc.EngineStub,
                         call_timeout=call_timeout)
    try:
        call = asyncio.ensure_future(client.call(epb.EngineRequest(query=epb.EngineQuery())))
        await asyncio.sleep(0.5)  # the stream is open and the message is in
        # The local link pings as gRPC's keepalive does (stage_link.py).
        assert isinstance(client._call, LinkCall) == (transport == "auto")
        if freeze is not None:
            freeze.send_signal(signal.SIGSTOP)
        # Bounded here too: before keepalive and deadlines this waited forever.
        with pytest.raises(StageError) as failed:
            await asyncio.wait_for(call, 30)
        return failed.value
    finally:
        await client.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_frozen_stage_fails_its_calls_as_unavailable(
        silent_stage: tuple[subprocess.Popen[str], str], transport: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRANSPORT_ENV, transport)
    process, address = silent_stage
    error = asyncio.run(_query(address, call_timeout=60, freeze=process, transport=transport))
    assert error.code == grpc.StatusCode.UNAVAILABLE
    assert error.message.startswith("engine stage is unavailable")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_stage_that_never_answers_fails_at_the_deadline_not_by_its_pings(
        silent_stage: tuple[subprocess.Popen[str], str], transport: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TRANSPORT_ENV, transport)
    # 7 s: three keepalive pings; the server must accept them (no GOAWAY too_many_pings, and
    # the link's pings are answered while the handler sits on its requests).
    error = asyncio.run(_query(silent_stage[1], call_timeout=7, freeze=None,
                               transport=transport))
    assert error.code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "engine stage did not answer within 7s" in error.message
