"""A stage killed mid-run: UNAVAILABLE naming it, in-flight requests end with "error", and once
it is back new requests work without restarting the others."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import SamplingParams
from strand.services.client import EngineClient
from strand.services.launch import Stack
from tests.e2e.conftest import engine_num_unfinished, start_stack

LONG = SamplingParams(temperature=0.0, max_tokens=500)


@pytest.fixture(scope="module")
def fault_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[Stack]:
    with start_stack(tiny_model_dir, tmp_path_factory.mktemp("fault-logs")) as s:
        yield s


@pytest.fixture
def fault_client(fault_stack: Stack) -> Iterator[EngineClient]:
    with EngineClient(fault_stack.gateway_address, timeout=30) as c:
        yield c


def _step_until_ended(client: EngineClient, ids: set[str], timeout: float = 15
                      ) -> tuple[dict[str, RequestOutput], list[str]]:
    """Step until every id has a final output; returns them and the errors Step raised."""
    finals: dict[str, RequestOutput] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout
    while set(finals) != ids and time.monotonic() < deadline:
        try:
            finals.update({o.request_id: o for o in client.step()
                           if isinstance(o, RequestOutput) and o.finished})
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE
            errors.append(exc.details())
            time.sleep(0.1)
    return finals, errors


def _works(client: EngineClient, request_id: str) -> RequestOutput:
    client.add_request(request_id, "back again", SamplingParams(temperature=0.0, max_tokens=3))
    finals, _ = _step_until_ended(client, {request_id})
    return finals[request_id]


def test_killed_engine_ends_requests_with_error_then_recovers(fault_stack: Stack,
                                                              fault_client: EngineClient) -> None:
    fault_client.add_request("e1", "doomed one", LONG)
    fault_client.add_request("e2", "doomed two", LONG)
    fault_client.step()
    fault_stack.kill("engine")
    finals, errors = _step_until_ended(fault_client, {"e1", "e2"})
    assert {o.outputs[0].finish_reason for o in finals.values()} == {"error"}
    assert all("engine stage is unavailable" in (o.error or "") for o in finals.values())
    assert all("engine" in e for e in errors)
    assert fault_client.get_num_unfinished_requests() == 0
    with pytest.raises(grpc.RpcError) as err:
        fault_client.add_request("e3", "while down", LONG)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "engine stage is unavailable" in err.value.details()
    assert fault_client.get_num_unfinished_requests() == 0
    fault_stack.start("engine")
    assert _works(fault_client, "e4").outputs[0].finish_reason == "length"


def test_killed_engine_ends_a_generate_stream_with_error(fault_stack: Stack,
                                                         fault_client: EngineClient) -> None:
    stream = fault_client.generate("stream then die", LONG, request_id="g1")
    first = next(stream)
    assert not first.finished
    fault_stack.kill("engine")
    rest = list(stream)
    assert rest[-1].finished
    assert rest[-1].outputs[0].finish_reason == "error"
    assert "engine stage is unavailable" in (rest[-1].error or "")
    fault_stack.start("engine")
    assert fault_client.get_num_unfinished_requests() == 0
    assert engine_num_unfinished(fault_stack) == 0


def test_a_restarted_engine_answers_server_info_at_once(fault_stack: Stack,
                                                        fault_client: EngineClient) -> None:
    # The ring's streams reconnect over the local link the moment the engine is back; the
    # gateway's gRPC channel to it may still be in its reconnect back-off. GetServerInfo (which
    # every EngineClient.generate asks first) must wait for it, not fail.
    for _ in range(3):
        fault_stack.kill("engine")
        fault_stack.start("engine")
        assert fault_client.get_server_info()["model"]


def test_killed_detokenizer_ends_requests_with_error_and_clears_the_engine(
        fault_stack: Stack, fault_client: EngineClient) -> None:
    fault_client.add_request("d1", "detok doomed", LONG)
    fault_client.step()
    fault_stack.kill("detokenizer")
    finals, errors = _step_until_ended(fault_client, {"d1"})
    assert finals["d1"].outputs[0].finish_reason == "error"
    assert "detokenizer stage is unavailable" in (finals["d1"].error or "")
    assert engine_num_unfinished(fault_stack) == 0
    fault_stack.start("detokenizer")
    assert _works(fault_client, "d2").outputs[0].finish_reason == "length"


def test_killed_tokenizer_is_unavailable_by_name_then_recovers(fault_stack: Stack,
                                                               fault_client: EngineClient
                                                               ) -> None:
    fault_stack.kill("tokenizer")
    with pytest.raises(grpc.RpcError) as err:
        fault_client.add_request("t1", "no tokenizer", LONG)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "tokenizer stage is unavailable" in err.value.details()
    assert fault_client.get_num_unfinished_requests() == 0
    fault_stack.start("tokenizer")
    assert _works(fault_client, "t2").outputs[0].finish_reason == "length"


def test_the_supervisor_restarts_a_killed_stage_and_adds_fail_fast_meanwhile(
        fault_stack: Stack, fault_client: EngineClient) -> None:
    from strand.services.launch import wait_healthy
    from strand.services.supervisor import Supervisor

    lines: list[str] = []
    supervisor = Supervisor(fault_stack, log=lines.append)
    supervisor.tick()
    fault_stack.kill("detokenizer")
    supervisor.tick()
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        fault_client.add_request("s1", "while down", LONG)
    # Fails fast (about a second: the wait for a resubscription), not after a stage timeout.
    assert time.monotonic() - started < 5
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "detokenizer" in err.value.details()
    deadline = time.monotonic() + 10
    while "detokenizer" not in supervisor.tick() and time.monotonic() < deadline:
        time.sleep(0.1)
    wait_healthy(fault_stack.address("detokenizer"), 60, name="detokenizer")
    assert lines[0].startswith("strand: detokenizer exited with code -9; restarting in 1 s")
    assert _works(fault_client, "s2").outputs[0].finish_reason == "length"
