"""Graceful drain: SIGTERM to `strand serve` with --shutdown-timeout (real processes)."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strand.engine_core.sampling_params import SamplingParams
from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import inference_pb2_grpc
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.client import add_request_message, generate_request
from strand.services.common.status import DRAINING_MESSAGE
from tests.e2e.conftest import ENGINE_FLAGS
from tests.e2e.test_cli import ENV, REPO_ROOT, _alive, _children, _gateway_address


def _serve(model_dir: Path, *flags: str) -> tuple[subprocess.Popen[str], str, list[int]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "strand.services.cli", "serve", "--model", str(model_dir),
         "--port", "0", *flags, *ENGINE_FLAGS],
        stdout=subprocess.PIPE, text=True, env=ENV, cwd=REPO_ROOT)
    address = _gateway_address(process)
    if address is None:
        process.kill()
        process.wait()
        pytest.fail("strand serve did not start")
    return process, address, _children(process.pid)


@pytest.fixture
def channel_of() -> Iterator[list[grpc.Channel]]:
    channels: list[grpc.Channel] = []
    yield channels
    for channel in channels:
        channel.close()


def _readiness(channel: grpc.Channel, service: str = "readiness") -> int:
    return health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=5).status


def _wait_not_serving(channel: grpc.Channel) -> float:
    """Seconds until readiness reads NOT_SERVING."""
    start = time.monotonic()
    while _readiness(channel) == health_pb2.HealthCheckResponse.SERVING:
        assert time.monotonic() - start < 5, "readiness still SERVING 5 s after SIGTERM"
        time.sleep(0.02)
    return time.monotonic() - start


class _Stream:
    """A Generate call read to its end on a thread: its outputs, and how it ended."""

    def __init__(self, stub: inference_pb2_grpc.InferenceStub, params: SamplingParams) -> None:
        self.call = stub.Generate(generate_request("drain me", params, None, None))
        self.outputs: list[pb.RequestOutput] = []
        self.error: grpc.RpcError | None = None
        self.first = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for output in self.call:
                self.outputs.append(output)
                self.first.set()
        except grpc.RpcError as exc:
            self.error = exc
        self.first.set()

    def finish_reason(self, timeout: float = 60) -> str:
        self._thread.join(timeout)
        assert self.error is None, f"the stream failed: {self.error}"
        assert self.outputs and self.outputs[-1].finished
        return self.outputs[-1].outputs[0].finish_reason


def _assert_all_exit(process: subprocess.Popen[str], children: list[int]) -> None:
    assert process.wait(timeout=60) == 0
    assert [c for c in children if _alive(c)] == []


def test_sigterm_drains_the_requests_in_flight_and_refuses_new_ones(
        tiny_model_dir: Path, channel_of: list[grpc.Channel]) -> None:
    # Manual mode: nothing runs until a Step, so the requests are surely in flight at SIGTERM.
    process, address, children = _serve(tiny_model_dir, "--shutdown-timeout", "60")
    try:
        assert len(children) == 4
        channel = grpc.insecure_channel(address)
        channel_of.append(channel)
        stub = inference_pb2_grpc.InferenceStub(channel)
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        stub.AddRequest(add_request_message("stepped", "drain me", params, None, 0, None),
                        timeout=30)
        stream = _Stream(stub, params)
        stream.call.initial_metadata()  # the stream's request is in
        assert _readiness(channel) == health_pb2.HealthCheckResponse.SERVING

        process.send_signal(signal.SIGTERM)
        _wait_not_serving(channel)
        assert _readiness(channel, "liveness") == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Generate(generate_request("late", params, None, None), timeout=30))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "draining" in (refused.value.details() or "")
        with pytest.raises(grpc.RpcError) as refused_add:
            stub.AddRequest(add_request_message("late", "x", params, None, 0, None), timeout=30)
        assert refused_add.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "draining" in (refused_add.value.details() or "")

        # The requests in flight are stepped to their end as usual.
        finished: dict[str, str] = {}
        for _ in range(100):
            resp: gpb.StepResponse = stub.Step(gpb.StepRequest(), timeout=30)
            for output in resp.outputs:
                if output.finished:
                    finished[output.request_id] = output.outputs[0].finish_reason
            if "stepped" in finished and stream.first.is_set() and stream.outputs \
                    and stream.outputs[-1].finished:
                break
        assert finished == {"stepped": "length"}
        assert stream.finish_reason() == "length"
        assert len(stream.outputs[-1].outputs[0].token_ids) == 6  # cumulative outputs
        _assert_all_exit(process, children)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_streams_past_the_shutdown_timeout_end_with_abort(
        tiny_model_dir: Path, channel_of: list[grpc.Channel]) -> None:
    process, address, children = _serve(tiny_model_dir, "--auto-step",
                                        "--shutdown-timeout", "0.5")
    try:
        channel = grpc.insecure_channel(address)
        channel_of.append(channel)
        stub = inference_pb2_grpc.InferenceStub(channel)
        # Far longer than half a second of decoding on the tiny model.
        params = SamplingParams(temperature=0.0, max_tokens=1900, ignore_eos=True)
        streams = [_Stream(stub, params) for _ in range(4)]
        for stream in streams:
            assert stream.first.wait(60) and stream.error is None
        start = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert [s.finish_reason() for s in streams] == ["abort"] * 4
        assert time.monotonic() - start < 15
        assert all(len(o.outputs[0].token_ids) < 1900 for s in streams for o in s.outputs)
        _assert_all_exit(process, children)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _post(host: str, port: int, path: str, body: dict[str, object] | None = None
          ) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        if body is None:
            conn.request("GET", path)
        else:
            conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


class _SSE:
    """A streaming /v1/completions read to its end on a thread: its data lines, and when the
    first and last came."""

    def __init__(self, host: str, port: int, max_tokens: int) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=60)
        self.conn.request("POST", "/v1/completions", json.dumps(
            {"prompt": "drain me", "max_tokens": max_tokens, "temperature": 0,
             "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}),
            {"Content-Type": "application/json"})
        self.events: list[dict[str, object]] = []
        self.done = False
        self.first = threading.Event()
        self.ended_at = 0.0
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        resp = self.conn.getresponse()
        assert resp.status == 200
        for raw in resp:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                self.done = True
            elif line.startswith("data: "):
                self.events.append(json.loads(line[len("data: "):]))
                self.first.set()
        self.ended_at = time.monotonic()
        self.conn.close()
        self.first.set()

    def join(self, timeout: float = 60) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the stream did not end"


def _openai_address(process: subprocess.Popen[str]) -> tuple[str, int]:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("strand OpenAI API at http://"), line
    host, port = line.split("//")[1].split("/")[0].rsplit(":", 1)
    return host, int(port)


def test_the_openai_front_drains_its_streams_and_answers_new_requests_503(
        tiny_model_dir: Path) -> None:
    process, _, children = _serve(tiny_model_dir, "--auto-step", "--openai-port", "0",
                                  "--shutdown-timeout", "60")
    try:
        assert len(children) == 5
        host, port = _openai_address(process)
        assert _post(host, port, "/health")[0] == 200
        max_tokens = 1500  # seconds of decoding on the tiny model: in flight at SIGTERM
        stream = _SSE(host, port, max_tokens)
        assert stream.first.wait(60) and not stream.done

        process.send_signal(signal.SIGTERM)
        start = time.monotonic()
        while (health := _post(host, port, "/health"))[0] == 200:  # until the front has it
            assert time.monotonic() - start < 10, "/health still 200 10 s after SIGTERM"
            time.sleep(0.02)
        assert health[0] == 503
        status, body = _post(host, port, "/v1/completions", {"prompt": "late", "max_tokens": 2})
        refused_at = time.monotonic()
        assert status == 503
        error = json.loads(body)["error"]
        assert error["message"] == DRAINING_MESSAGE and error["code"] == "service_unavailable"

        stream.join()
        assert stream.done and stream.ended_at > refused_at  # it was in flight all along
        choices = [c for e in stream.events for c in e["choices"]]  # type: ignore[attr-defined]
        assert choices[-1]["finish_reason"] == "length"
        assert stream.events[-1]["usage"]["completion_tokens"] == max_tokens  # type: ignore[index]
        _assert_all_exit(process, children)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
