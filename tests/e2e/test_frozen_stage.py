"""A frozen stage (SIGSTOP: its connections stay open, nothing answers) turns into UNAVAILABLE
for the requests it holds within a bounded time, instead of stalling every call; once it runs
again (SIGCONT) the ring is used again without restarting anything."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strand.services.client import EngineClient
from strand.services.launch import Stack
from tests.e2e.conftest import engine_num_unfinished, start_stack
from tests.e2e.test_faults import LONG, _step_until_ended, _works


@pytest.fixture(scope="module")
def frozen_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                 ) -> Iterator[Stack]:
    with start_stack(tiny_model_dir, tmp_path_factory.mktemp("frozen-logs")) as s:
        yield s


@pytest.fixture
def frozen_client(frozen_stack: Stack) -> Iterator[EngineClient]:
    with EngineClient(frozen_stack.gateway_address, timeout=30) as c:
        yield c


def _freeze(stack: Stack, name: str) -> None:
    stack.processes[name].send_signal(signal.SIGSTOP)


def _thaw(stack: Stack, name: str) -> None:
    stack.processes[name].send_signal(signal.SIGCONT)


def test_a_frozen_engine_ends_its_requests_with_error_then_recovers(
        frozen_stack: Stack, frozen_client: EngineClient) -> None:
    frozen_client.add_request("f1", "frozen one", LONG)
    frozen_client.step()
    _freeze(frozen_stack, "engine")
    try:
        # Bounded: within 20 s (the stages' keepalive gives up after about 5).
        finals, errors = _step_until_ended(frozen_client, {"f1"}, timeout=20)
        assert finals["f1"].outputs[0].finish_reason == "error"
        assert "engine stage is unavailable" in (finals["f1"].error or "")
        assert all("engine" in e for e in errors)
        with pytest.raises(grpc.RpcError) as err:
            frozen_client.add_request("f2", "while frozen", LONG)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        _thaw(frozen_stack, "engine")
    assert _works(frozen_client, "f3").outputs[0].finish_reason == "length"
    assert engine_num_unfinished(frozen_stack) == 0


def test_a_frozen_detokenizer_ends_a_generate_stream_with_error(
        frozen_stack: Stack, frozen_client: EngineClient) -> None:
    stream = frozen_client.generate("stream then freeze", LONG, request_id="g1")
    assert not next(stream).finished
    _freeze(frozen_stack, "detokenizer")
    try:
        rest = list(stream)
    finally:
        _thaw(frozen_stack, "detokenizer")
    assert rest[-1].finished and rest[-1].outputs[0].finish_reason == "error"
    assert "detokenizer stage is unavailable" in (rest[-1].error or "")
    assert _works(frozen_client, "g2").outputs[0].finish_reason == "length"
    assert engine_num_unfinished(frozen_stack) == 0
