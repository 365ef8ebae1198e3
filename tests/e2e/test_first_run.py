"""`strand serve` as a first-time user meets it: Generate with nobody calling Step, a port that is
already taken, and a signal before the stack is ready (real processes)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from strand.services._proto.strand.v1 import gateway_pb2 as gpb
from strand.services._proto.strand.v1 import gateway_pb2_grpc
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.launch import REPO_ROOT, free_port
from tests.e2e.conftest import ENGINE_FLAGS
from tests.e2e.test_cli import ENV, _alive, _children


def _serve(model_dir: Path, port: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "strand.services.cli", "serve", "--model", str(model_dir),
         "--port", str(port), *ENGINE_FLAGS], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=ENV, cwd=REPO_ROOT)


def _wait_ready(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    for _ in range(200):  # bounded: the stages print a few lines each before "ready"
        line = process.stdout.readline()
        if not line:
            break
        if line.startswith("strand gateway ready at "):
            return line.split()[-1]
    raise AssertionError(f"no ready line; exit code {process.poll()}")


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    process = _serve(tiny_model_dir, port)
    try:
        _wait_ready(process)
        yield process, port
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_generate_streams_without_any_step_caller(served: tuple[subprocess.Popen[str], int]
                                                  ) -> None:
    _, port = served
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)
        call = stub.Generate(gpb.GenerateRequest(
            prompt=pb.Prompt(text="nobody steps"),
            params=pb.SamplingParams(temperature=0.0, max_tokens=4)), timeout=60)
        outputs = list(call)
    assert [o.finished for o in outputs] == [False, False, False, True]
    assert len(outputs[-1].outputs[0].token_ids) == 4


def test_a_taken_port_is_one_line_naming_port_and_flag(
        served: tuple[subprocess.Popen[str], int], tiny_model_dir: Path) -> None:
    _, port = served
    second = subprocess.run(
        [sys.executable, "-m", "strand.services.cli", "serve", "--model", str(tiny_model_dir),
         "--port", str(port)], capture_output=True, text=True, env=ENV, cwd=REPO_ROOT,
        timeout=120)
    assert second.returncode == 1
    assert second.stderr.strip().splitlines() == [
        f"strand serve: error: port {port} on 127.0.0.1 is in use (Address already in use); "
        f"choose another with --port"]
    # The server itself refuses too (no SO_REUSEPORT), not only serve's check before launching.
    gateway = subprocess.run([sys.executable, "-m", "strand.services.gateway", "--port", str(port)],
                             capture_output=True, text=True, env=ENV, cwd=REPO_ROOT, timeout=120)
    assert gateway.returncode == 1
    last = gateway.stderr.strip().splitlines()[-1]
    assert last.startswith(f"strand gateway: error: gateway: cannot listen on 127.0.0.1:{port}")
    assert "--port" in last


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_start_up_stops_every_service(tiny_model_dir: Path, signum: int) -> None:
    process = _serve(tiny_model_dir, 0)
    try:
        children: list[int] = []
        # The three stages start at once, the gateway once they are up. Bounded in time, not
        # in polls: on a loaded machine serve takes seconds to get as far as starting them.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            children = _children(process.pid)
            if len(children) >= 3 or process.poll() is not None:
                break
            time.sleep(0.01)
        assert len(children) == 3, children  # not ready yet: the gateway has not started
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 1
        assert err.strip().splitlines()[-1] == (
            f"strand serve: error: stopped by {signal.Signals(signum).name} during start-up; "
            f"every service started is stopped")
        assert [c for c in children if _alive(c)] == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
