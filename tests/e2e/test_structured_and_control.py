"""Over real gRPC: structured outputs travel with a request's SamplingParams through every stage,
and Control's engine-wide calls (sleep/wake, profiling, supported tasks) reach the engine."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strand.engine_core import RequestOutput, SamplingParams, StructuredOutputsParams
from strand.engine_core.engine_extras import PROFILER_DIR_ENV
from strand.services._proto.strand.v1 import control_pb2 as cpb
from strand.services._proto.strand.v1 import control_pb2_grpc
from strand.services.client import EngineClient, RequestError
from strand.services.launch import Stack
from tests.e2e.conftest import engine_num_unfinished, start_stack
from tests.engine_core.structured_output.constraints import KINDS, assert_satisfies, constraint


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces")


@pytest.fixture(scope="module")
def own_stack(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
              trace_dir: Path) -> Iterator[Stack]:
    """A stack of its own: sleeping it must not disturb the shared one; its engine profiles
    into trace_dir (the stages inherit this process's environment)."""
    old = os.environ.get(PROFILER_DIR_ENV)
    os.environ[PROFILER_DIR_ENV] = str(trace_dir)
    try:
        stack = start_stack(tiny_model_dir, tmp_path_factory.mktemp("control-logs"))
    finally:
        if old is None:
            os.environ.pop(PROFILER_DIR_ENV)
        else:
            os.environ[PROFILER_DIR_ENV] = old
    with stack as s:
        yield s


@pytest.fixture
def client(own_stack: Stack) -> Iterator[EngineClient]:
    with EngineClient(own_stack.gateway_address, timeout=60) as c:
        yield c
        assert c.get_num_unfinished_requests() == 0


def _run(client: EngineClient) -> dict[str, RequestOutput]:
    finished: dict[str, RequestOutput] = {}
    for _ in range(500):
        if not client.has_unfinished_requests():
            return finished
        for out in client.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            if out.finished:
                finished[out.request_id] = out
    raise AssertionError("requests still unfinished after 500 steps")


def _json_object_bias(client: EngineClient, tokenizer_dir: Path) -> dict[int, float]:
    from strand.engine_core.processing.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(tokenizer_dir)
    (close,) = tok.encode("}", add_special_tokens=False)
    assert tok.eos_token_id is not None
    return {close: 50.0, tok.eos_token_id: 50.0}


def test_every_constraint_kind_holds_over_grpc(client: EngineClient,
                                               tiny_model_dir: Path) -> None:
    bias = _json_object_bias(client, tiny_model_dir)
    for temperature in (0.0, 1.0):
        for kind in KINDS:
            client.add_request(f"{kind}-{temperature}", "hello world", SamplingParams(
                max_tokens=48, temperature=temperature, seed=3,
                structured_outputs=constraint(kind),
                logit_bias=bias if kind == "json_object" else None))
    client.add_request("free", "hello world", SamplingParams(max_tokens=8, ignore_eos=True))
    finished = _run(client)
    for temperature in (0.0, 1.0):
        for kind in KINDS:
            out = finished[f"{kind}-{temperature}"].outputs[0]  # type: ignore[attr-defined]
            assert out.finish_reason == "stop", (kind, out.text)
            assert_satisfies(kind, out.text)
    assert len(finished["free"].outputs[0].token_ids) == 8  # type: ignore[attr-defined]


def test_invalid_schema_is_invalid_argument_naming_the_field(client: EngineClient,
                                                             own_stack: Stack) -> None:
    bad = StructuredOutputsParams(json=json.dumps({"type": "object", "properties": 5}))
    with pytest.raises(RequestError, match=r"structured_outputs\.json is invalid") as info:
        client.add_request("bad", "hello", SamplingParams(structured_outputs=bad))
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    # Refused by the engine's compile, with nothing left behind in any stage.
    assert client.get_num_unfinished_requests() == 0
    assert engine_num_unfinished(own_stack) == 0
    client.add_request("bad", "hello", SamplingParams(  # the id is free again
        max_tokens=8, structured_outputs=StructuredOutputsParams(choice=["a", "b"])))
    assert _run(client)["bad"].outputs[0].text in ("a", "b")  # type: ignore[attr-defined]


def test_sleep_refuses_requests_until_wake_up(client: EngineClient) -> None:
    params = SamplingParams(temperature=0.0, max_tokens=6)
    client.add_request("before", "the quick", params)
    before = _run(client)["before"].outputs[0].token_ids  # type: ignore[attr-defined]
    assert not client.is_sleeping()
    client.sleep(level=1)
    try:
        assert client.is_sleeping()
        with pytest.raises(grpc.RpcError) as info:
            client.add_request("asleep", "the quick", params)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # type: ignore[attr-defined]
        assert "sleeping" in info.value.details()  # type: ignore[attr-defined]
        assert client.get_num_unfinished_requests() == 0
    finally:
        client.wake_up()
    assert not client.is_sleeping()
    client.add_request("after", "the quick", params)
    assert _run(client)["after"].outputs[0].token_ids == before  # type: ignore[attr-defined]


def test_level_2_sleep_wakes_by_tags(client: EngineClient) -> None:
    client.sleep(level=2)
    try:
        client.wake_up(["weights"])
        assert client.is_sleeping()  # the KV cache is still asleep
    finally:
        client.wake_up(["kv_cache"])
    assert not client.is_sleeping()
    client.add_request("woken", "the quick", SamplingParams(temperature=0.0, max_tokens=3))
    assert len(_run(client)["woken"].outputs[0].token_ids) == 3  # type: ignore[attr-defined]


def test_bad_sleep_level_is_invalid_argument(own_stack: Stack) -> None:
    with grpc.insecure_channel(own_stack.gateway_address) as channel:
        stub = control_pb2_grpc.ControlStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Sleep(cpb.SleepRequest(level=3), timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert "level must be 1 or 2" in info.value.details()  # type: ignore[attr-defined]
        assert not stub.IsSleeping(cpb.IsSleepingRequest(), timeout=30).is_sleeping


def test_profile_writes_a_trace_on_the_engine(client: EngineClient, trace_dir: Path) -> None:
    client.start_profile()
    client.add_request("p", "hello", SamplingParams(temperature=0.0, max_tokens=2))
    _run(client)
    path = Path(client.stop_profile())
    assert path.parent == trace_dir
    assert json.loads(path.read_text())["traceEvents"]
    with pytest.raises(RequestError, match="not running"):
        client.stop_profile()


def test_supported_tasks(client: EngineClient) -> None:
    assert client.get_supported_tasks() == ("generate",)
